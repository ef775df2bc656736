//! A small arithmetic language for `calculate`: numbers, `+ - * / % ^`, parentheses,
//! unary minus, a fixed set of functions and the constants `pi` and `e`.
//!
//! Nothing is evaluated as code: the input is tokenized, parsed by precedence
//! climbing into values directly, and every failure is an [`ExpressionError`] that
//! names the position. Input length and nesting depth are capped so that no input
//! can exhaust the stack.

use std::fmt;

/// Longest expression accepted, in bytes.
pub const MAX_INPUT_LEN: usize = 1000;
/// Deepest nesting of parentheses, function calls and unary operators.
pub const MAX_DEPTH: usize = 64;

/// Why an expression could not be evaluated.
#[derive(Debug, Clone, PartialEq)]
pub enum ExpressionError {
    Empty,
    TooLong {
        len: usize,
    },
    TooDeep,
    UnexpectedChar {
        ch: char,
        at: usize,
    },
    BadNumber {
        text: String,
        at: usize,
    },
    UnexpectedToken {
        found: String,
        at: usize,
        expected: &'static str,
    },
    UnknownName {
        name: String,
        at: usize,
    },
    WrongArity {
        function: String,
        expected: &'static str,
        got: usize,
    },
    DivisionByZero {
        at: usize,
    },
    NotFinite {
        what: String,
    },
}

impl fmt::Display for ExpressionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExpressionError::Empty => f.write_str("the expression is empty"),
            ExpressionError::TooLong { len } => write!(
                f,
                "the expression is {len} bytes long; at most {MAX_INPUT_LEN} are accepted"
            ),
            ExpressionError::TooDeep => write!(
                f,
                "the expression nests deeper than {MAX_DEPTH} levels (parentheses, calls, unary minus)"
            ),
            ExpressionError::UnexpectedChar { ch, at } => {
                write!(f, "unexpected character `{ch}` at position {at}")
            }
            ExpressionError::BadNumber { text, at } => {
                write!(f, "malformed number `{text}` at position {at}")
            }
            ExpressionError::UnexpectedToken {
                found,
                at,
                expected,
            } => write!(f, "expected {expected} at position {at}, found {found}"),
            ExpressionError::UnknownName { name, at } => write!(
                f,
                "unknown name `{name}` at position {at}; known: pi, e, sqrt, abs, ln, log10, sin, cos, tan, min, max, round, floor, ceil"
            ),
            ExpressionError::WrongArity {
                function,
                expected,
                got,
            } => write!(f, "`{function}` takes {expected} argument(s), got {got}"),
            ExpressionError::DivisionByZero { at } => {
                write!(f, "division by zero at position {at}")
            }
            ExpressionError::NotFinite { what } => {
                write!(f, "the result is not a finite real number ({what})")
            }
        }
    }
}

impl std::error::Error for ExpressionError {}

/// Evaluates `input`; the result is always finite.
pub fn evaluate(input: &str) -> Result<f64, ExpressionError> {
    if input.len() > MAX_INPUT_LEN {
        return Err(ExpressionError::TooLong { len: input.len() });
    }
    let tokens = tokenize(input)?;
    if tokens.len() == 1 {
        return Err(ExpressionError::Empty);
    }
    let mut parser = Parser {
        tokens: &tokens,
        pos: 0,
        depth: 0,
    };
    let value = parser.expression(0)?;
    let next = parser.peek();
    if next.kind != TokenKind::End {
        return Err(ExpressionError::UnexpectedToken {
            found: next.kind.describe(),
            at: next.at,
            expected: "an operator or the end of the expression",
        });
    }
    finite(value, "overflow or undefined operation")
}

#[derive(Debug, Clone, PartialEq)]
enum TokenKind {
    Number(f64),
    Name(String),
    Op(char),
    LParen,
    RParen,
    Comma,
    End,
}

impl TokenKind {
    fn describe(&self) -> String {
        match self {
            TokenKind::Number(n) => format!("number `{n}`"),
            TokenKind::Name(name) => format!("`{name}`"),
            TokenKind::Op(op) => format!("`{op}`"),
            TokenKind::LParen => "`(`".into(),
            TokenKind::RParen => "`)`".into(),
            TokenKind::Comma => "`,`".into(),
            TokenKind::End => "the end of the expression".into(),
        }
    }
}

#[derive(Debug, Clone)]
struct Token {
    kind: TokenKind,
    /// Character position (0-based) in the input.
    at: usize,
}

fn tokenize(input: &str) -> Result<Vec<Token>, ExpressionError> {
    let chars: Vec<char> = input.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let ch = chars[i];
        let at = i;
        if ch.is_whitespace() {
            i += 1;
            continue;
        }
        if ch.is_ascii_digit() || ch == '.' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.') {
                i += 1;
            }
            // Exponent: `1e5`, `2.5E-3`. An `e` not followed by digits is left for
            // the name rule, which then reports `2e` as unknown.
            if i < chars.len() && matches!(chars[i], 'e' | 'E') {
                let mut j = i + 1;
                if j < chars.len() && matches!(chars[j], '+' | '-') {
                    j += 1;
                }
                if j < chars.len() && chars[j].is_ascii_digit() {
                    while j < chars.len() && chars[j].is_ascii_digit() {
                        j += 1;
                    }
                    i = j;
                }
            }
            let text: String = chars[start..i].iter().collect();
            let value: f64 = text.parse().map_err(|_| ExpressionError::BadNumber {
                text: text.clone(),
                at,
            })?;
            tokens.push(Token {
                kind: TokenKind::Number(value),
                at,
            });
            continue;
        }
        if ch.is_ascii_alphabetic() || ch == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let name: String = chars[start..i].iter().collect();
            tokens.push(Token {
                kind: TokenKind::Name(name.to_ascii_lowercase()),
                at,
            });
            continue;
        }
        let kind = match ch {
            '+' | '-' | '*' | '/' | '%' | '^' => TokenKind::Op(ch),
            // Common spellings models produce.
            '×' => TokenKind::Op('*'),
            '÷' => TokenKind::Op('/'),
            '−' => TokenKind::Op('-'),
            '(' => TokenKind::LParen,
            ')' => TokenKind::RParen,
            ',' => TokenKind::Comma,
            _ => return Err(ExpressionError::UnexpectedChar { ch, at }),
        };
        tokens.push(Token { kind, at });
        i += 1;
    }
    // `**` is a common spelling of power.
    let mut merged: Vec<Token> = Vec::with_capacity(tokens.len() + 1);
    for token in tokens {
        if token.kind == TokenKind::Op('*')
            && merged
                .last()
                .is_some_and(|prev| prev.kind == TokenKind::Op('*') && prev.at + 1 == token.at)
        {
            if let Some(prev) = merged.last_mut() {
                prev.kind = TokenKind::Op('^');
            }
            continue;
        }
        merged.push(token);
    }
    merged.push(Token {
        kind: TokenKind::End,
        at: chars.len(),
    });
    Ok(merged)
}

struct Parser<'a> {
    tokens: &'a [Token],
    pos: usize,
    depth: usize,
}

/// Binding power of a binary operator: (left, right). Right-associative `^` binds
/// tighter on its left than on its right.
fn binding_power(op: char) -> Option<(u8, u8)> {
    match op {
        '+' | '-' => Some((1, 2)),
        '*' | '/' | '%' => Some((3, 4)),
        '^' => Some((8, 7)),
        _ => None,
    }
}

/// Unary minus binds looser than `^` (`-2^2` is -4) and tighter than `*`.
const UNARY_POWER: u8 = 5;

impl Parser<'_> {
    fn peek(&self) -> &Token {
        // The token list always ends with `End`, and `pos` never moves past it.
        &self.tokens[self.pos.min(self.tokens.len() - 1)]
    }

    fn advance(&mut self) -> Token {
        let token = self.peek().clone();
        if token.kind != TokenKind::End {
            self.pos += 1;
        }
        token
    }

    fn enter(&mut self) -> Result<(), ExpressionError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            Err(ExpressionError::TooDeep)
        } else {
            Ok(())
        }
    }

    fn leave(&mut self) {
        self.depth -= 1;
    }

    fn expression(&mut self, min_power: u8) -> Result<f64, ExpressionError> {
        self.enter()?;
        let result = self.expression_inner(min_power);
        self.leave();
        result
    }

    fn expression_inner(&mut self, min_power: u8) -> Result<f64, ExpressionError> {
        let mut lhs = self.prefix()?;
        loop {
            let token = self.peek().clone();
            let TokenKind::Op(op) = token.kind else { break };
            let Some((left_power, right_power)) = binding_power(op) else {
                break;
            };
            if left_power < min_power {
                break;
            }
            self.advance();
            let rhs = self.expression(right_power)?;
            lhs = apply_binary(op, lhs, rhs, token.at)?;
        }
        Ok(lhs)
    }

    fn prefix(&mut self) -> Result<f64, ExpressionError> {
        let token = self.advance();
        match token.kind {
            TokenKind::Number(n) => Ok(n),
            TokenKind::Op('-') => Ok(-self.expression(UNARY_POWER)?),
            TokenKind::Op('+') => self.expression(UNARY_POWER),
            TokenKind::LParen => {
                let value = self.expression(0)?;
                self.expect_rparen()?;
                Ok(value)
            }
            TokenKind::Name(name) => {
                if self.peek().kind == TokenKind::LParen {
                    self.advance();
                    let args = self.arguments()?;
                    call_function(&name, &args, token.at)
                } else {
                    match name.as_str() {
                        "pi" => Ok(std::f64::consts::PI),
                        "e" => Ok(std::f64::consts::E),
                        _ => Err(ExpressionError::UnknownName { name, at: token.at }),
                    }
                }
            }
            other => Err(ExpressionError::UnexpectedToken {
                found: other.describe(),
                at: token.at,
                expected: "a number, `(`, a function or a constant",
            }),
        }
    }

    /// Arguments after `(`, through the closing `)`.
    fn arguments(&mut self) -> Result<Vec<f64>, ExpressionError> {
        let mut args = Vec::new();
        if self.peek().kind == TokenKind::RParen {
            self.advance();
            return Ok(args);
        }
        loop {
            args.push(self.expression(0)?);
            let token = self.advance();
            match token.kind {
                TokenKind::Comma => continue,
                TokenKind::RParen => return Ok(args),
                other => {
                    return Err(ExpressionError::UnexpectedToken {
                        found: other.describe(),
                        at: token.at,
                        expected: "`,` or `)`",
                    });
                }
            }
        }
    }

    fn expect_rparen(&mut self) -> Result<(), ExpressionError> {
        let token = self.advance();
        if token.kind == TokenKind::RParen {
            Ok(())
        } else {
            Err(ExpressionError::UnexpectedToken {
                found: token.kind.describe(),
                at: token.at,
                expected: "`)`",
            })
        }
    }
}

fn apply_binary(op: char, lhs: f64, rhs: f64, at: usize) -> Result<f64, ExpressionError> {
    match op {
        '+' => Ok(lhs + rhs),
        '-' => Ok(lhs - rhs),
        '*' => Ok(lhs * rhs),
        '/' if rhs == 0.0 => Err(ExpressionError::DivisionByZero { at }),
        '/' => Ok(lhs / rhs),
        '%' if rhs == 0.0 => Err(ExpressionError::DivisionByZero { at }),
        '%' => Ok(lhs % rhs),
        '^' => finite(lhs.powf(rhs), "power"),
        _ => Err(ExpressionError::UnexpectedToken {
            found: format!("`{op}`"),
            at,
            expected: "an operator",
        }),
    }
}

fn call_function(name: &str, args: &[f64], at: usize) -> Result<f64, ExpressionError> {
    let one = |f: fn(f64) -> f64| -> Result<f64, ExpressionError> {
        match args {
            [x] => finite(f(*x), name),
            _ => Err(ExpressionError::WrongArity {
                function: name.to_owned(),
                expected: "1",
                got: args.len(),
            }),
        }
    };
    match name {
        "sqrt" => one(f64::sqrt),
        "abs" => one(f64::abs),
        "ln" => one(f64::ln),
        "log10" => one(f64::log10),
        "sin" => one(f64::sin),
        "cos" => one(f64::cos),
        "tan" => one(f64::tan),
        "floor" => one(f64::floor),
        "ceil" => one(f64::ceil),
        // `round(x)` or `round(x, digits)`.
        "round" => match args {
            [x] => Ok(x.round()),
            [x, digits] if digits.fract() == 0.0 && digits.abs() <= 15.0 => {
                let scale = 10f64.powi(*digits as i32);
                finite((x * scale).round() / scale, name)
            }
            [_, _] => Err(ExpressionError::WrongArity {
                function: name.to_owned(),
                expected: "1, or 2 with a whole number of digits between -15 and 15 as the second",
                got: 2,
            }),
            _ => Err(ExpressionError::WrongArity {
                function: name.to_owned(),
                expected: "1 or 2",
                got: args.len(),
            }),
        },
        "min" | "max" => {
            if args.is_empty() {
                return Err(ExpressionError::WrongArity {
                    function: name.to_owned(),
                    expected: "at least 1",
                    got: 0,
                });
            }
            let pick = if name == "min" { f64::min } else { f64::max };
            Ok(args.iter().copied().fold(args[0], pick))
        }
        _ => Err(ExpressionError::UnknownName {
            name: name.to_owned(),
            at,
        }),
    }
}

fn finite(value: f64, what: &str) -> Result<f64, ExpressionError> {
    if value.is_finite() {
        Ok(value)
    } else {
        Err(ExpressionError::NotFinite {
            what: what.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(input: &str) -> f64 {
        evaluate(input).expect(input)
    }

    #[test]
    fn precedence_and_associativity() {
        assert_eq!(eval("1 + 2 * 3"), 7.0);
        assert_eq!(eval("(1 + 2) * 3"), 9.0);
        assert_eq!(eval("2 ^ 3 ^ 2"), 512.0);
        assert_eq!(eval("-2 ^ 2"), -4.0);
        assert_eq!(eval("2 ^ -1"), 0.5);
        assert_eq!(eval("10 - 4 - 3"), 3.0);
        assert_eq!(eval("100 / 10 / 5"), 2.0);
        assert_eq!(eval("7 % 4 * 2"), 6.0);
        assert_eq!(eval("--3"), 3.0);
        assert_eq!(eval("2 * -3"), -6.0);
        assert_eq!(eval("2**10"), 1024.0);
        assert_eq!(eval("1.5e3 + .5"), 1500.5);
    }

    #[test]
    fn functions_and_constants() {
        assert_eq!(eval("sqrt(16) + abs(-2)"), 6.0);
        assert_eq!(eval("max(1, 5, 3) - min(4, 2)"), 3.0);
        assert_eq!(eval("round(2.567, 2)"), 2.57);
        assert_eq!(eval("floor(2.7) + ceil(2.1)"), 5.0);
        assert_eq!(eval("log10(1000)"), 3.0);
        assert!((eval("ln(e)") - 1.0).abs() < 1e-12);
        assert!((eval("sin(pi / 2)") - 1.0).abs() < 1e-12);
        assert!((eval("cos(0) + tan(0)") - 1.0).abs() < 1e-12);
        assert_eq!(eval("PI"), std::f64::consts::PI);
    }

    #[test]
    fn errors_are_specific() {
        assert_eq!(
            evaluate("1 / 0"),
            Err(ExpressionError::DivisionByZero { at: 2 })
        );
        assert!(matches!(
            evaluate("5 % (2 - 2)"),
            Err(ExpressionError::DivisionByZero { .. })
        ));
        assert_eq!(evaluate("   "), Err(ExpressionError::Empty));
        assert!(matches!(
            evaluate("1 +"),
            Err(ExpressionError::UnexpectedToken { .. })
        ));
        assert!(matches!(
            evaluate("(1 + 2"),
            Err(ExpressionError::UnexpectedToken { .. })
        ));
        assert!(matches!(
            evaluate("1 2"),
            Err(ExpressionError::UnexpectedToken { .. })
        ));
        assert!(matches!(
            evaluate("2 & 3"),
            Err(ExpressionError::UnexpectedChar { ch: '&', .. })
        ));
        assert!(matches!(
            evaluate("foo(1)"),
            Err(ExpressionError::UnknownName { .. })
        ));
        assert!(matches!(
            evaluate("sqrt(1, 2)"),
            Err(ExpressionError::WrongArity { .. })
        ));
        assert!(matches!(
            evaluate("1.2.3"),
            Err(ExpressionError::BadNumber { .. })
        ));
        assert!(matches!(
            evaluate("sqrt(-1)"),
            Err(ExpressionError::NotFinite { .. })
        ));
        assert!(matches!(
            evaluate("10 ^ 400"),
            Err(ExpressionError::NotFinite { .. })
        ));
        let long = "1+".repeat(600) + "1";
        assert!(matches!(
            evaluate(&long),
            Err(ExpressionError::TooLong { .. })
        ));
    }

    #[test]
    fn deep_nesting_is_refused_without_overflow() {
        let parens = "(".repeat(400) + "1" + &")".repeat(400);
        assert_eq!(evaluate(&parens), Err(ExpressionError::TooDeep));
        let minus = "-".repeat(900) + "1";
        assert_eq!(evaluate(&minus), Err(ExpressionError::TooDeep));
        let calls = "abs(".repeat(150) + "1" + &")".repeat(150);
        assert_eq!(evaluate(&calls), Err(ExpressionError::TooDeep));
        let shallow = "(".repeat(20) + "1" + &")".repeat(20);
        assert_eq!(evaluate(&shallow), Ok(1.0));
    }
}
