//! Property tests of the expression parser (issue 31): whatever the text, it answers
//! a finite number or an error and never panics; and a generated expression tree,
//! printed with its parentheses, evaluates to what the tree computes.

use proptest::prelude::*;

use crate::expression::{MAX_INPUT_LEN, evaluate};

/// An expression tree, printed fully parenthesised and computed directly.
#[derive(Debug, Clone)]
enum Tree {
    Number(u32),
    Neg(Box<Tree>),
    Binary(Box<Tree>, char, Box<Tree>),
    Call(&'static str, Box<Tree>),
}

impl Tree {
    fn text(&self) -> String {
        match self {
            Tree::Number(n) => n.to_string(),
            Tree::Neg(inner) => format!("(-{})", inner.text()),
            Tree::Binary(a, op, b) => format!("({} {op} {})", a.text(), b.text()),
            Tree::Call(name, inner) => format!("{name}({})", inner.text()),
        }
    }

    fn value(&self) -> f64 {
        match self {
            Tree::Number(n) => f64::from(*n),
            Tree::Neg(inner) => -inner.value(),
            Tree::Binary(a, op, b) => {
                let (a, b) = (a.value(), b.value());
                match op {
                    '+' => a + b,
                    '-' => a - b,
                    '*' => a * b,
                    // The evaluator refuses a division by zero, so the reference has no
                    // value either (not 0 / (1 / 0) = 0 through infinity).
                    '/' if b == 0.0 => f64::NAN,
                    '/' => a / b,
                    _ => f64::NAN,
                }
            }
            Tree::Call(name, inner) => {
                let x = inner.value();
                match *name {
                    "abs" => x.abs(),
                    "floor" => x.floor(),
                    "ceil" => x.ceil(),
                    _ => f64::NAN,
                }
            }
        }
    }
}

fn tree() -> impl Strategy<Value = Tree> {
    let leaf = (0u32..1000).prop_map(Tree::Number);
    leaf.prop_recursive(6, 48, 2, |inner| {
        prop_oneof![
            inner.clone().prop_map(|t| Tree::Neg(Box::new(t))),
            (
                inner.clone(),
                prop::sample::select(vec!['+', '-', '*', '/']),
                inner.clone()
            )
                .prop_map(|(a, op, b)| Tree::Binary(Box::new(a), op, Box::new(b))),
            (prop::sample::select(vec!["abs", "floor", "ceil"]), inner)
                .prop_map(|(name, t)| Tree::Call(name, Box::new(t))),
        ]
    })
}

/// Text made of the parser's own pieces, in any order: it reaches deeper than
/// random bytes.
fn expression_like() -> impl Strategy<Value = String> {
    let pieces = prop::sample::select(vec![
        "1",
        "2.5",
        "1e308",
        "0",
        ".",
        "e",
        "pi",
        "+",
        "-",
        "*",
        "/",
        "%",
        "^",
        "(",
        ")",
        ",",
        "sqrt",
        "min",
        "max",
        "round",
        "log10",
        "ln",
        " ",
        "1e",
        "--",
        "((((",
        "9999999999",
    ]);
    prop::collection::vec(pieces, 0..60).prop_map(|p| p.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn any_text_gets_a_finite_number_or_an_error(text in ".{0,200}") {
        if let Ok(value) = evaluate(&text) {
            prop_assert!(value.is_finite(), "{text:?} gave {value}");
        }
    }

    #[test]
    fn expression_like_text_never_panics(text in expression_like()) {
        if let Ok(value) = evaluate(&text) {
            prop_assert!(value.is_finite(), "{text:?} gave {value}");
        }
    }

    #[test]
    fn a_printed_tree_evaluates_to_what_it_computes(tree in tree()) {
        let text = tree.text();
        prop_assume!(text.len() <= MAX_INPUT_LEN);
        let expected = tree.value();
        match evaluate(&text) {
            Ok(value) => {
                let tolerance = 1e-9 * expected.abs().max(1.0);
                prop_assert!((value - expected).abs() <= tolerance, "{text} = {value}, expected {expected}");
            }
            // Division by zero and the like: refused, never a wrong number.
            Err(e) => prop_assert!(!expected.is_finite(), "{text}: {e}, expected {expected}"),
        }
    }
}
