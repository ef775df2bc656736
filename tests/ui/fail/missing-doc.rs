#[loadout::tool(domain = "scratchpad", keywords = ["sql"])]
fn query() -> i64 {
    1
}

fn main() {}
