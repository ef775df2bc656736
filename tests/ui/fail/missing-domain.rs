/// Adds two numbers.
#[loadout::tool(keywords = ["add"])]
fn add() -> i64 {
    2
}

fn main() {}
