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

/// Registers a function as a tool. See the `loadout` crate documentation.
#[proc_macro_attribute]
pub fn tool(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand::tool(attr.into(), item.into()).into()
}
