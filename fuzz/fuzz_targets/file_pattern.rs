//! `find_files`' name patterns (`*`, `?`, `**`): compiled or refused, then matched
//! against names, never a panic or a runaway match.
#![no_main]

libfuzzer_sys::fuzz_target!(|input: (&str, &str, bool)| {
    let (pattern, path, case_sensitive) = input;
    if let Ok(pattern) = loadout_domain_filesystem::Pattern::new(pattern, case_sensitive) {
        let name = path.rsplit('/').next().unwrap_or(path);
        let _ = pattern.matches(path, name);
    }
});
