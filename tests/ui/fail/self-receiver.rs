struct Calculator;

impl Calculator {
    /// Adds.
    #[loadout::tool(domain = "core", keywords = ["add"])]
    fn add(&self) -> i64 {
        1
    }
}

fn main() {}
