//! The `filesystem_roots` setting (a JSON array or `:`-separated paths), and the
//! confinement of a caller's path to the roots it names.
#![no_main]

libfuzzer_sys::fuzz_target!(|input: (&str, &str)| {
    let (setting, path) = input;
    let _ = loadout_domain_filesystem::Roots::parse(setting);
    // Paths resolved against a root that exists everywhere.
    if let Ok(roots) = loadout_domain_filesystem::Roots::parse("[\"/tmp\"]")
        && let Ok(resolved) = roots.resolve(path)
    {
        assert!(
            resolved.path.starts_with(&roots.all()[0].canonical),
            "{path:?} left the root"
        );
    }
});
