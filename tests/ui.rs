//! Compile errors of `#[tool]`, each spanned to the offending token.

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.pass("../tests/ui/pass/*.rs");
    cases.compile_fail("../tests/ui/fail/*.rs");
}
