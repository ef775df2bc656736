//! From a checked [`ToolSpec`] to the registered tool.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote};
use syn::ItemFn;

use crate::parse::{RawAttr, ToolAttr};
use crate::validate::{Param, ToolSpec, validate};

pub fn tool(attr: TokenStream, item: TokenStream) -> TokenStream {
    let function: ItemFn = match syn::parse2(item.clone()) {
        Ok(function) => function,
        Err(_) => {
            let error = syn::Error::new(
                Span::call_site(),
                "#[tool] goes on a free function: `fn` or `async fn`",
            );
            let error = error.to_compile_error();
            return quote! { #error #item };
        }
    };
    let attr_tokens = attr.clone();
    let mut errors = Vec::new();
    let raw: RawAttr = match syn::parse2(attr) {
        Ok(raw) => raw,
        Err(error) => {
            let error = error.to_compile_error();
            return quote! { #error #function };
        }
    };
    let attr = ToolAttr::from_raw(raw, &mut errors);
    let spec = validate(attr, &attr_tokens, &function, &mut errors);
    let output = match spec {
        Some(spec) if errors.is_empty() => {
            let registration = registration(&spec, &function);
            quote! { #function #registration }
        }
        _ => {
            let errors = errors.into_iter().map(|e| e.to_compile_error());
            quote! { #(#errors)* #function }
        }
    };
    if std::env::var_os("LOADOUT_MACROS_DEBUG").is_some() {
        eprintln!("{output}");
    }
    output
}

fn registration(spec: &ToolSpec, function: &ItemFn) -> TokenStream {
    let p = quote!(::loadout::__private);
    let fn_ident = &function.sig.ident;
    let call_ident = format_ident!("__loadout_call_{}", fn_ident);
    let schema_ident = format_ident!("__loadout_schema_{}", fn_ident);

    let args_ty = spec.params.iter().find_map(|param| match param {
        Param::Args(ty) => Some(ty),
        Param::Context => None,
    });
    let parse_args = match args_ty {
        Some(ty) => quote! { let __args: #ty = #p::parse_args(__args)?; },
        None => quote! { let _ = __args; },
    };
    let schema_body = match args_ty {
        Some(ty) => quote! { #p::schema_for::<#ty>() },
        None => quote! { #p::empty_object_schema() },
    };
    let call_args = spec.params.iter().map(|param| match param {
        Param::Args(_) => quote!(__args),
        Param::Context => quote!(&__ctx),
    });
    let invoke = if function.sig.asyncness.is_some() {
        quote! { #fn_ident(#(#call_args),*).await }
    } else {
        quote! { #fn_ident(#(#call_args),*) }
    };

    let name = &spec.name;
    let domain = &spec.domain;
    let description = &spec.description;
    let keywords = &spec.keywords;
    let examples = &spec.examples;
    let conflicts = &spec.conflicts;
    let title = option_str(spec.title.as_deref());
    let tier = match spec.tier.as_deref() {
        Some(tier) => quote!(::core::option::Option::Some(#p::tier_from_str(#tier))),
        None => quote!(::core::option::Option::None),
    };
    let read_only = option_bool(spec.read_only);
    let destructive = option_bool(spec.destructive);
    let idempotent = option_bool(spec.idempotent);
    let open_world = option_bool(spec.open_world);
    let pins_domain = spec.pins_domain;

    quote! {
        #[doc(hidden)]
        #[allow(non_snake_case)]
        fn #call_ident(
            __ctx: #p::Context,
            __args: #p::serde_json::Value,
        ) -> #p::CallFuture {
            ::std::boxed::Box::pin(async move {
                #[allow(unused_imports)]
                use #p::{PlainReturn as _, ResultReturn as _};
                #parse_args
                let __returned = #invoke;
                let _ = &__ctx;
                (&#p::Returned(__returned)).to_tool_result()
            })
        }

        #[doc(hidden)]
        #[allow(non_snake_case)]
        fn #schema_ident() -> #p::serde_json::Value {
            #schema_body
        }

        const _: () = {
            #p::inventory::submit! {
                #p::ToolEntry {
                    name: #name,
                    domain: #domain,
                    keywords: &[#(#keywords),*],
                    examples: &[#(#examples),*],
                    conflicts: &[#(#conflicts),*],
                    description: #description,
                    title: #title,
                    tier: #tier,
                    annotations: #p::Annotations {
                        read_only: #read_only,
                        destructive: #destructive,
                        idempotent: #idempotent,
                        open_world: #open_world,
                    },
                    pins_domain: #pins_domain,
                    input_schema: #schema_ident,
                    call: #call_ident,
                    file: ::core::file!(),
                    line: ::core::line!(),
                }
            }
        };
    }
}

fn option_str(value: Option<&str>) -> TokenStream {
    match value {
        Some(s) => quote!(::core::option::Option::Some(#s)),
        None => quote!(::core::option::Option::None),
    }
}

fn option_bool(value: Option<bool>) -> TokenStream {
    match value {
        Some(b) => quote!(::core::option::Option::Some(#b)),
        None => quote!(::core::option::Option::None),
    }
}
