//! One module per subcommand.

pub mod call;
pub mod settings;
pub mod tools;
