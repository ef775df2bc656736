/// Echoes a value.
#[loadout::tool(domain = "core", keywords = ["echo"])]
fn echo<T: serde::Serialize>(value: T) -> T {
    value
}

fn main() {}
