//! Token counts with a real tokenizer (o200k_base, the GPT-4o family's encoding).

use std::sync::OnceLock;

/// Tokens in `text` under o200k_base.
pub fn count(text: &str) -> usize {
    tokenizer().encode_ordinary(text).len()
}

fn tokenizer() -> &'static tiktoken_rs::CoreBPE {
    static BPE: OnceLock<tiktoken_rs::CoreBPE> = OnceLock::new();
    // The vocabulary ships inside the crate; failing to parse it is a build defect,
    // not an input error.
    BPE.get_or_init(|| {
        tiktoken_rs::o200k_base().expect("o200k_base vocabulary ships with tiktoken-rs")
    })
}

/// Tokens a JSON value costs when sent as compact JSON.
pub fn count_json(value: &serde_json::Value) -> usize {
    count(&value.to_string())
}

/// Tokens a tool's definition costs when sent (OpenAI format).
pub fn tool_cost(tool: &loadout::Tool) -> usize {
    count_json(&loadout::export::openai(tool))
}

#[cfg(test)]
mod tests {
    #[test]
    fn counts_are_real_tokens() {
        assert_eq!(super::count(""), 0);
        let n = super::count("hello world");
        assert!((1..=3).contains(&n), "{n}");
        assert!(super::count("a much longer sentence about tools and routing") > n);
    }
}
