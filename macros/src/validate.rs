//! Checks the attribute and the function for meaning, yielding what expansion needs.

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::{FnArg, ItemFn, LitStr, Type};

use crate::parse::{ToolAttr, doc_comment};

/// What a parameter of the tool function receives.
pub enum Param {
    /// The arguments struct, deserialized from the call's JSON.
    Args(Box<Type>),
    /// `&ToolContext`.
    Context,
}

/// A tool the expansion can emit without further checks.
pub struct ToolSpec {
    pub name: String,
    pub domain: String,
    pub keywords: Vec<String>,
    pub examples: Vec<String>,
    pub conflicts: Vec<String>,
    pub title: Option<String>,
    pub tier: Option<String>,
    pub read_only: Option<bool>,
    pub destructive: Option<bool>,
    pub idempotent: Option<bool>,
    pub open_world: Option<bool>,
    pub pins_domain: bool,
    pub description: String,
    pub params: Vec<Param>,
}

pub fn validate(
    attr: ToolAttr,
    attr_tokens: &proc_macro2::TokenStream,
    function: &ItemFn,
    errors: &mut Vec<syn::Error>,
) -> Option<ToolSpec> {
    let sig = &function.sig;
    // Checked in the order the user reads the attribute and the function, so that
    // the errors come out in that order too.
    let domain = domain_of(&attr, attr_tokens, errors);
    let name = name_of(&attr, sig, errors);
    check_lists(&attr, errors);
    let description = description_of(function, errors);
    check_signature(sig, errors);
    let params = params_of(sig, errors);

    if errors.is_empty() {
        Some(ToolSpec {
            name,
            domain,
            keywords: attr.keywords.iter().map(LitStr::value).collect(),
            examples: attr.examples.iter().map(LitStr::value).collect(),
            conflicts: attr.conflicts.iter().map(LitStr::value).collect(),
            title: attr.title.as_ref().map(LitStr::value),
            tier: attr.tier.as_ref().map(LitStr::value),
            read_only: attr.read_only.as_ref().map(|b| b.value),
            destructive: attr.destructive.as_ref().map(|b| b.value),
            idempotent: attr.idempotent.as_ref().map(|b| b.value),
            open_world: attr.open_world.as_ref().map(|b| b.value),
            pins_domain: attr.pins_domain.as_ref().is_some_and(|b| b.value),
            description,
            params,
        })
    } else {
        None
    }
}

/// The `domain` key, required.
fn domain_of(
    attr: &ToolAttr,
    attr_tokens: &proc_macro2::TokenStream,
    errors: &mut Vec<syn::Error>,
) -> String {
    match &attr.domain {
        Some(lit) => {
            check_identifier(lit, "domain", false, errors);
            lit.value()
        }
        None => {
            let message = "missing `domain`: every tool belongs to a domain, e.g. #[tool(domain = \"scratchpad\")]";
            errors.push(if attr_tokens.is_empty() {
                syn::Error::new(Span::call_site(), message)
            } else {
                syn::Error::new_spanned(attr_tokens, message)
            });
            String::new()
        }
    }
}

/// The `name` key, or the function's name.
fn name_of(attr: &ToolAttr, sig: &syn::Signature, errors: &mut Vec<syn::Error>) -> String {
    match &attr.name {
        Some(lit) => {
            check_identifier(lit, "name", true, errors);
            lit.value()
        }
        None => {
            let ident = sig.ident.to_string();
            let ident = ident.strip_prefix("r#").unwrap_or(&ident).to_owned();
            if ident.len() > 64 || ident.bytes().any(|b| b.is_ascii_uppercase()) {
                errors.push(syn::Error::new(
                    sig.ident.span(),
                    "tool names are lowercase and at most 64 characters; rename the function or set `name = \"...\"`",
                ));
            }
            ident
        }
    }
}

/// `keywords` lowercase and not empty, `conflicts` names, `tier` free or pro.
fn check_lists(attr: &ToolAttr, errors: &mut Vec<syn::Error>) {
    for keyword in &attr.keywords {
        let value = keyword.value();
        if value.trim().is_empty() {
            errors.push(syn::Error::new(
                keyword.span(),
                "keywords must not be empty",
            ));
        } else if value.chars().any(char::is_uppercase) {
            errors.push(syn::Error::new(
                keyword.span(),
                format!(
                    "keywords are matched case-insensitively and must be written in lowercase: \"{}\"",
                    value.to_lowercase()
                ),
            ));
        }
    }
    for conflict in &attr.conflicts {
        check_identifier(conflict, "conflicts", true, errors);
    }
    if let Some(tier) = &attr.tier
        && !matches!(tier.value().as_str(), "free" | "pro")
    {
        errors.push(syn::Error::new(
            tier.span(),
            "`tier` is \"free\" or \"pro\"",
        ));
    }
}

/// The doc comment: the tool's description, required.
fn description_of(function: &ItemFn, errors: &mut Vec<syn::Error>) -> String {
    match doc_comment(&function.attrs) {
        Some((text, _)) => text,
        None => {
            errors.push(syn::Error::new(
                function.sig.ident.span(),
                "missing doc comment: the doc comment is the tool's description for models; its first sentence is the short hint",
            ));
            String::new()
        }
    }
}

/// A tool function is not generic, `const` or variadic.
fn check_signature(sig: &syn::Signature, errors: &mut Vec<syn::Error>) {
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        errors.push(syn::Error::new_spanned(
            &sig.generics,
            "tool functions cannot be generic: the registry needs one concrete input schema",
        ));
    }
    if let Some(constness) = &sig.constness {
        errors.push(syn::Error::new(
            constness.span(),
            "tool functions cannot be `const`",
        ));
    }
    if let Some(variadic) = &sig.variadic {
        errors.push(syn::Error::new(
            variadic.span(),
            "tool functions cannot be variadic",
        ));
    }
}

/// The parameters: at most one arguments struct and one `&ToolContext`.
fn params_of(sig: &syn::Signature, errors: &mut Vec<syn::Error>) -> Vec<Param> {
    let mut params = Vec::new();
    let mut n_args = 0;
    let mut n_context = 0;
    for input in &sig.inputs {
        match input {
            FnArg::Receiver(receiver) => errors.push(syn::Error::new_spanned(
                receiver,
                "tools are free functions: remove `self` (methods cannot be registered)",
            )),
            FnArg::Typed(pat_type) => match &*pat_type.ty {
                Type::Reference(reference) => {
                    n_context += 1;
                    if reference.mutability.is_some() {
                        errors.push(syn::Error::new_spanned(
                            reference,
                            "the context parameter is a shared reference: `ctx: &ToolContext`",
                        ));
                    } else if n_context > 1 {
                        errors.push(syn::Error::new_spanned(
                            pat_type,
                            "only one context parameter (`&ToolContext`) is allowed",
                        ));
                    } else {
                        params.push(Param::Context);
                    }
                }
                ty => {
                    n_args += 1;
                    if n_args > 1 {
                        errors.push(syn::Error::new_spanned(
                            pat_type,
                            "a tool takes at most one arguments struct; put every field in one struct deriving Deserialize and JsonSchema",
                        ));
                    } else {
                        params.push(Param::Args(Box::new(ty.clone())));
                    }
                }
            },
        }
    }
    params
}

/// Domain names are `[a-z0-9_]`, tool names also allow `-`; at most 64 characters.
fn check_identifier(lit: &LitStr, key: &str, allow_dash: bool, errors: &mut Vec<syn::Error>) {
    let value = lit.value();
    let ok = !value.is_empty()
        && value.len() <= 64
        && value.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || (allow_dash && b == b'-')
        });
    if !ok {
        let alphabet = if allow_dash {
            "a-z, 0-9, `_` and `-`"
        } else {
            "a-z, 0-9 and `_`"
        };
        errors.push(syn::Error::new(
            lit.span(),
            format!("`{key}` must be 1-64 characters of {alphabet}: \"{value}\""),
        ));
    }
}
