//! A setting written by anyone: the key and the value checked, for the operator and
//! for the model, never a panic.
#![no_main]

loadout::setting! {
    key: "fuzz_choice",
    kind: loadout::SettingKind::Choice(&["on", "off"]),
    trust: loadout::Trust::Operator,
    description: "a declared switch",
}

loadout::setting! {
    key: "fuzz_url",
    kind: loadout::SettingKind::Url,
    trust: loadout::Trust::Operator,
    description: "a declared URL",
}

loadout::setting! {
    key: "fuzz_secret",
    kind: loadout::SettingKind::Secret,
    trust: loadout::Trust::Model,
    description: "a declared credential",
}

libfuzzer_sys::fuzz_target!(|input: (u8, &str, &str)| {
    let (which, key, value) = input;
    let key = match which % 4 {
        0 => "fuzz_choice",
        1 => "fuzz_url",
        2 => "fuzz_secret",
        _ => key,
    };
    for setter in [loadout::Setter::Operator, loadout::Setter::Model] {
        let _ = loadout::check_setting(key, Some(value), setter);
    }
    let _ = loadout::setting_spec::check_url(value);
});
