//! From tokens to a typed attribute: keys and values, each with its span.

use proc_macro2::Span;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{Expr, ExprArray, ExprLit, Ident, Lit, LitBool, LitStr, Token};

/// One `key = value` of the attribute, as written.
pub struct KeyValue {
    pub key: Ident,
    pub value: Expr,
}

impl Parse for KeyValue {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let key: Ident = input.call(syn::ext::IdentExt::parse_any)?;
        input.parse::<Token![=]>()?;
        let value: Expr = input.parse()?;
        Ok(KeyValue { key, value })
    }
}

/// The attribute's arguments, parsed but not yet checked for meaning.
pub struct RawAttr {
    pub pairs: Vec<KeyValue>,
}

impl Parse for RawAttr {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let pairs = Punctuated::<KeyValue, Token![,]>::parse_terminated(input)?;
        Ok(RawAttr {
            pairs: pairs.into_iter().collect(),
        })
    }
}

/// The attribute after every key was recognised. Missing optional keys are `None`.
#[derive(Default)]
pub struct ToolAttr {
    pub domain: Option<LitStr>,
    pub name: Option<LitStr>,
    pub title: Option<LitStr>,
    pub tier: Option<LitStr>,
    pub keywords: Vec<LitStr>,
    pub examples: Vec<LitStr>,
    pub conflicts: Vec<LitStr>,
    pub read_only: Option<LitBool>,
    pub destructive: Option<LitBool>,
    pub idempotent: Option<LitBool>,
    pub open_world: Option<LitBool>,
    pub pins_domain: Option<LitBool>,
}

pub const KNOWN_KEYS: &str = "domain, keywords, name, title, tier, examples, conflicts, read_only, destructive, idempotent, open_world, pins_domain";

impl ToolAttr {
    /// Assigns each pair to its field; unknown keys, duplicate keys and values of
    /// the wrong kind become errors on the offending token.
    pub fn from_raw(raw: RawAttr, errors: &mut Vec<syn::Error>) -> ToolAttr {
        let mut attr = ToolAttr::default();
        let mut seen: Vec<String> = Vec::new();
        for KeyValue { key, value } in raw.pairs {
            let key_name = key.to_string();
            if seen.contains(&key_name) {
                errors.push(syn::Error::new(
                    key.span(),
                    format!("duplicate key `{key_name}`"),
                ));
                continue;
            }
            seen.push(key_name.clone());
            match key_name.as_str() {
                "domain" => attr.domain = lit_str(&value, &key_name, errors),
                "name" => attr.name = lit_str(&value, &key_name, errors),
                "title" => attr.title = lit_str(&value, &key_name, errors),
                "tier" => attr.tier = lit_str(&value, &key_name, errors),
                "keywords" => attr.keywords = lit_str_array(&value, &key_name, errors),
                "examples" => attr.examples = lit_str_array(&value, &key_name, errors),
                "conflicts" => attr.conflicts = lit_str_array(&value, &key_name, errors),
                "read_only" => attr.read_only = lit_bool(&value, &key_name, errors),
                "destructive" => attr.destructive = lit_bool(&value, &key_name, errors),
                "idempotent" => attr.idempotent = lit_bool(&value, &key_name, errors),
                "open_world" => attr.open_world = lit_bool(&value, &key_name, errors),
                "pins_domain" => attr.pins_domain = lit_bool(&value, &key_name, errors),
                _ => errors.push(syn::Error::new(
                    key.span(),
                    format!("unknown key `{key_name}`; expected one of: {KNOWN_KEYS}"),
                )),
            }
        }
        attr
    }
}

fn lit_str(value: &Expr, key: &str, errors: &mut Vec<syn::Error>) -> Option<LitStr> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Str(s), ..
        }) => Some(s.clone()),
        other => {
            errors.push(syn::Error::new_spanned(
                other,
                format!("`{key}` takes a string literal, e.g. {key} = \"...\""),
            ));
            None
        }
    }
}

fn lit_bool(value: &Expr, key: &str, errors: &mut Vec<syn::Error>) -> Option<LitBool> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Bool(b), ..
        }) => Some(b.clone()),
        other => {
            errors.push(syn::Error::new_spanned(
                other,
                format!("`{key}` takes `true` or `false`"),
            ));
            None
        }
    }
}

fn lit_str_array(value: &Expr, key: &str, errors: &mut Vec<syn::Error>) -> Vec<LitStr> {
    let Expr::Array(ExprArray { elems, .. }) = value else {
        errors.push(syn::Error::new_spanned(
            value,
            format!("`{key}` takes an array of string literals, e.g. {key} = [\"a\", \"b\"]"),
        ));
        return Vec::new();
    };
    elems
        .iter()
        .filter_map(|elem| match elem {
            Expr::Lit(ExprLit {
                lit: Lit::Str(s), ..
            }) => Some(s.clone()),
            other => {
                errors.push(syn::Error::new_spanned(
                    other,
                    format!("`{key}` entries must be string literals"),
                ));
                None
            }
        })
        .collect()
}

/// The doc comment of an item, one line per `///` line, common indent removed.
pub fn doc_comment(attrs: &[syn::Attribute]) -> Option<(String, Span)> {
    let mut lines = Vec::new();
    let mut span = None;
    for attr in attrs {
        if !attr.path().is_ident("doc") {
            continue;
        }
        if let syn::Meta::NameValue(nv) = &attr.meta
            && let Expr::Lit(ExprLit {
                lit: Lit::Str(s), ..
            }) = &nv.value
        {
            span.get_or_insert(s.span());
            lines.push(s.value());
        }
    }
    let text = lines
        .iter()
        .map(|line| line.strip_prefix(' ').unwrap_or(line).trim_end())
        .collect::<Vec<_>>()
        .join("\n");
    let text = text.trim().to_owned();
    if text.is_empty() {
        None
    } else {
        span.map(|span| (text, span))
    }
}
