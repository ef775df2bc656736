use schemars::JsonSchema;
use serde::Deserialize;

#[derive(Deserialize, JsonSchema)]
struct A {
    x: i64,
}

#[derive(Deserialize, JsonSchema)]
struct B {
    y: i64,
}

/// Adds.
#[loadout::tool(domain = "core", keywords = ["add"])]
fn add(a: A, b: B) -> i64 {
    a.x + b.y
}

fn main() {}
