/// Runs a query.
#[loadout::tool(domain = "scratchpad", keywrods = ["sql"])]
fn query() -> i64 {
    1
}

fn main() {}
