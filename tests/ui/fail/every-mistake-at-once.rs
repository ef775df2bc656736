#[loadout::tool(domain = "Bad Domain", keywords = ["SQL"], colour = "red")]
fn query() -> i64 {
    1
}

fn main() {}
