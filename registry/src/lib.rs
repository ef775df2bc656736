//! `loadout`: the contract between tools and the servers that expose them.
//!
//! [`Tool`] and [`Domain`] (what a tool is, wherever it was declared), the link-time
//! collection that `#[tool]` and [`domain!`] submit to, the [`Registry`] that validates
//! arguments, checks settings and calls tools, the [`ToolContext`] a tool body sees,
//! the [`engine`]s of the domains that keep data (implemented by the store), schema
//! helpers, export formats and errors.
//!
//! It must not depend on a domain crate, a storage driver, an encoder, a tokenizer,
//! axum or rmcp: every domain compiles it, so it stays small. Storage reaches it only
//! through the [`Storage`] trait.

mod context;
mod domain;
pub mod engine;
mod error;
pub mod export;
mod registry;
pub mod schema;
pub mod setting_spec;
pub mod settings;
mod storage;
mod tool;
pub mod toolkit;

pub use context::{ControlFuture, SessionControl, ToolContext, meta};
pub use domain::{Domain, DomainEntry};
pub use error::{RegistryError, ToolError};
pub use registry::{CALL_TIMEOUT, CallOutput, Registry, RegistryBuilder};
pub use setting_spec::{
    Applies, Setter, SettingEntry, SettingKind, SettingRefused, Trust, applies_of, check_setting,
    is_credential_key, names_a_place, setting_spec, setting_specs, trust_of, where_to_set,
};
pub use settings::{Settings, is_secret_key, mask_secret, validate_setting_key};
pub use storage::{BoxFuture, SettingsChange, Storage, StoreError};
pub use tool::{Annotations, Backend, CallFuture, ExternalCall, Tier, Tool, ToolEntry};

/// Declares `fn` items as tools; `loadout_macros::tool` lists the keys it takes.
pub use loadout_macros::tool;

// Domain crates depend on `loadout` only; these re-exports spare them a second
// version of each crate the generated code names.
pub use schemars;
pub use serde;
pub use serde_json;

/// Declares a domain once, next to its tools.
///
/// ```ignore
/// loadout::domain! {
///     name: "weather",
///     description: "Forecasts and current conditions.",
///     settings_keys: ["openweathermap_api_key"],
///     keywords: ["weather", "forecast"],
/// }
/// ```
///
/// `settings_keys` empty (or left out) means the domain is always active. Optional:
/// `tier: "free" | "pro"`, `always_on: true` (exposed on every turn; only `core`),
/// `conflicts: ["other_domain"]`.
#[macro_export]
macro_rules! domain {
    (
        name: $name:literal,
        description: $description:literal
        $(, settings_keys: [$($key:literal),* $(,)?])?
        $(, keywords: [$($keyword:literal),* $(,)?])?
        $(, tier: $tier:literal)?
        $(, always_on: $always_on:literal)?
        $(, conflicts: [$($conflict:literal),* $(,)?])?
        $(,)?
    ) => {
        const _: () = {
            $crate::__private::inventory::submit! {
                $crate::DomainEntry {
                    name: $name,
                    description: $description,
                    settings_keys: &[$($($key),*)?],
                    keywords: &[$($($keyword),*)?],
                    tier: $crate::__private::tier_from_str(
                        $crate::__private::first_or("free", &[$($tier)?]),
                    ),
                    always_on: $crate::__private::first_bool_or(false, &[$($always_on)?]),
                    conflicts: &[$($($conflict),*)?],
                    file: file!(),
                    line: line!(),
                }
            }
        };
    };
}

#[doc(hidden)]
pub mod __private {
    //! Items for generated code only. Not a stable interface.
    pub use crate::schema::schema_for;
    pub use crate::tool::{Annotations, CallFn, CallFuture, ToolEntry};
    pub use inventory;
    pub use schemars;
    pub use serde;
    pub use serde_json;

    use crate::{Tier, ToolContext, ToolError};

    pub const fn tier_from_str(s: &str) -> Tier {
        match s.as_bytes() {
            b"pro" => Tier::Pro,
            _ => Tier::Free,
        }
    }

    pub const fn first_or(default: &'static str, given: &[&'static str]) -> &'static str {
        match given {
            [first, ..] => first,
            [] => default,
        }
    }

    /// The validator `setting!` was given, or one that accepts any value.
    /// The declared moment a value takes effect, or at once when none is declared.
    pub const fn first_applies(
        given: &[crate::setting_spec::Applies],
    ) -> crate::setting_spec::Applies {
        match given {
            [first, ..] => *first,
            [] => crate::setting_spec::Applies::Live,
        }
    }

    /// The declared trust, or the operator's when none is declared.
    pub const fn first_trust(given: &[crate::setting_spec::Trust]) -> crate::setting_spec::Trust {
        match given {
            [first, ..] => *first,
            [] => crate::setting_spec::Trust::Operator,
        }
    }

    pub const fn first_validator(
        given: &[crate::setting_spec::Validator],
    ) -> crate::setting_spec::Validator {
        match given {
            [first, ..] => *first,
            [] => crate::setting_spec::any_value,
        }
    }

    pub const fn first_bool_or(default: bool, given: &[bool]) -> bool {
        match given {
            [first, ..] => *first,
            [] => default,
        }
    }

    /// Deserializes the arguments struct of a tool; the error names the field.
    pub fn parse_args<T: serde::de::DeserializeOwned>(
        args: serde_json::Value,
    ) -> Result<T, ToolError> {
        serde_json::from_value(args).map_err(|e| ToolError::InvalidArgs {
            field: None,
            message: e.to_string(),
        })
    }

    /// Wraps what a tool body returned so that method resolution picks the
    /// `Result` conversion when it applies and the plain one otherwise (autoref
    /// specialization): the return type is never recognised by its spelling.
    pub struct Returned<T>(pub T);

    pub trait ResultReturn {
        fn to_tool_result(&self) -> Result<serde_json::Value, ToolError>;
    }

    impl<T: serde::Serialize, E: std::fmt::Display> ResultReturn for Returned<Result<T, E>> {
        fn to_tool_result(&self) -> Result<serde_json::Value, ToolError> {
            match &self.0 {
                Ok(value) => to_value(value),
                Err(e) => Err(ToolError::Execution(e.to_string())),
            }
        }
    }

    pub trait PlainReturn {
        fn to_tool_result(&self) -> Result<serde_json::Value, ToolError>;
    }

    impl<T: serde::Serialize> PlainReturn for &Returned<T> {
        fn to_tool_result(&self) -> Result<serde_json::Value, ToolError> {
            to_value(&self.0)
        }
    }

    fn to_value<T: serde::Serialize>(value: &T) -> Result<serde_json::Value, ToolError> {
        serde_json::to_value(value)
            .map_err(|e| ToolError::Execution(format!("result is not JSON: {e}")))
    }

    /// Keeps the context type nameable from generated code.
    pub type Context = ToolContext;

    /// Schema of a tool that takes no arguments.
    pub fn empty_object_schema() -> serde_json::Value {
        serde_json::json!({"type": "object", "properties": {}})
    }
}
