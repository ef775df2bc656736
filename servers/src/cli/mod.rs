//! One module per subcommand.

pub mod audit;
pub mod call;
pub mod replay;
pub mod route;
pub mod settings;
pub mod tools;
