/// Runs a query.
#[loadout::tool(domain = "scratchpad", keywords = ["sql", "Table"])]
fn query() -> i64 {
    1
}

fn main() {}
