//! `#[tool]`: turns a documented `fn` into a registered Loadout tool.
//!
//! The attribute is parsed ([`parse`]), checked ([`validate`]) and expanded
//! ([`expand`]). Every mistake becomes a `syn::Error` spanned to the user's token,
//! all of them reported in one compile; on error the function is still emitted
//! unchanged so that no second wave of errors follows.
//!
//! The expansion names only `::loadout::__private`, so domain crates depend on
//! `loadout` alone.

mod expand;
mod parse;
mod validate;

use proc_macro::TokenStream;

/// Registers a function as a tool of a domain declared with `loadout::domain!`.
///
/// Keys: `domain` (required), `keywords`, `name`, `title`, `tier`, `examples`,
/// `conflicts`, `read_only`, `destructive`, `idempotent`, `open_world`, `pins_domain`.
/// The doc comment is the tool's description (its first sentence the hint); the
/// argument struct derives `Deserialize` and `JsonSchema`.
#[proc_macro_attribute]
pub fn tool(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand::tool(attr.into(), item.into()).into()
}
