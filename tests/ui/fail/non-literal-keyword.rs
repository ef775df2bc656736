const SQL: &str = "sql";

/// Runs a query.
#[loadout::tool(domain = "scratchpad", keywords = [SQL, "table"])]
fn query() -> i64 {
    1
}

fn main() {}
