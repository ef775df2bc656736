//! Compile errors of `#[tool]`, each spanned to the offending token. The cases live
//! in the workspace's `tests/ui/` (one file per mistake, with its expected stderr).
//!
//! This runs from the macro crate so that trybuild's scratch project depends on
//! `loadout` alone, not on the servers and every domain.

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.pass("../tests/ui/pass/*.rs");
    cases.compile_fail("../tests/ui/fail/*.rs");
}
