//! `calculate`'s expression parser: a finite number or an error, never a panic.
#![no_main]

libfuzzer_sys::fuzz_target!(|text: &str| {
    if let Ok(value) = loadout_domain_core::evaluate(text) {
        assert!(value.is_finite(), "{text:?} gave {value}");
    }
});
