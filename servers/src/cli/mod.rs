//! One module per subcommand.

pub mod audit;
pub mod call;
pub mod settings;
pub mod tools;
