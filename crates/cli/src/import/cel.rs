//! The part of Limitador's CEL conditions and variables that Charon's
//! `limits:` express: `descriptors[N].KEY == 'VALUE'` and `!=` (also
//! `descriptors[N]['KEY']`, either side of the operator, `'` or `"`
//! quotes), and variables `descriptors[N].KEY`. Limitador's older syntax,
//! a bare `KEY` and an unquoted `VALUE`, is read as `descriptors[0]` and
//! as text. Anything else (`&&`, `||`, functions, numbers, other
//! operators) is not expressed, and [`parse_condition`] says why.

/// A reference to a descriptor entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Entry {
    pub descriptor: usize,
    pub key: String,
    /// Written in the older syntax (a bare key).
    pub bare: bool,
}

/// A condition Charon expresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Condition {
    pub entry: Entry,
    pub equals: bool,
    pub value: String,
    /// The value was not quoted (the older syntax).
    pub bare_value: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Ident(String),
    Str(String),
    Int(u64),
    Sym(&'static str),
}

fn tokens(text: &str) -> Result<Vec<Token>, String> {
    let mut out = Vec::new();
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '\'' || c == '"' {
            let mut s = String::new();
            i += 1;
            loop {
                match chars.get(i) {
                    None => return Err("a string is not closed".into()),
                    Some(&q) if q == c => break,
                    Some('\\') => {
                        let e = chars.get(i + 1).ok_or("a string is not closed")?;
                        s.push(match e {
                            '\\' => '\\',
                            '\'' => '\'',
                            '"' => '"',
                            'n' => '\n',
                            't' => '\t',
                            other => return Err(format!("the escape \\{other} is not read here")),
                        });
                        i += 2;
                        continue;
                    }
                    Some(&other) => s.push(other),
                }
                i += 1;
            }
            i += 1;
            out.push(Token::Str(s));
        } else if c.is_ascii_digit() {
            let start = i;
            while i < chars.len() && chars[i].is_ascii_digit() {
                i += 1;
            }
            let n: String = chars[start..i].iter().collect();
            out.push(Token::Int(
                n.parse().map_err(|_| format!("{n} is too large"))?,
            ));
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_alphanumeric() || matches!(chars[i], '_' | '-' | ':'))
            {
                i += 1;
            }
            out.push(Token::Ident(chars[start..i].iter().collect()));
        } else {
            let two: String = chars[i..chars.len().min(i + 2)].iter().collect();
            let sym = match (two.as_str(), c) {
                ("==", _) => "==",
                ("!=", _) => "!=",
                ("&&", _) => "&&",
                ("||", _) => "||",
                (_, '[') => "[",
                (_, ']') => "]",
                (_, '.') => ".",
                (_, '(') => "(",
                (_, ')') => ")",
                (_, '/') => "/",
                (_, '@') => "@",
                _ => return Err(format!("the character {c:?} is not read here")),
            };
            i += sym.len();
            out.push(Token::Sym(sym));
        }
    }
    Ok(out)
}

/// One side of a comparison, or a variable.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Operand {
    Entry(Entry),
    Str(String),
}

/// `descriptors[N].key`, `descriptors[N]['key']`, or a bare dotted name.
fn operand(t: &[Token]) -> Option<Operand> {
    use Token::{Ident, Int, Str, Sym};
    match t {
        [Str(s)] => Some(Operand::Str(s.clone())),
        [Ident(d), Sym("["), Int(n), Sym("]"), rest @ ..] if d == "descriptors" => {
            let descriptor = usize::try_from(*n).ok()?;
            let key = match rest {
                [Sym("."), Ident(k)] => k.clone(),
                [Sym("["), Str(k), Sym("]")] => k.clone(),
                _ => return None,
            };
            Some(Operand::Entry(Entry {
                descriptor,
                key,
                bare: false,
            }))
        }
        [Ident(first), rest @ ..] => {
            // A bare key (the older syntax): a dotted name.
            let mut key = first.clone();
            let mut it = rest.chunks(2);
            for pair in &mut it {
                match pair {
                    [Sym("."), Ident(k)] => {
                        key.push('.');
                        key.push_str(k);
                    }
                    _ => return None,
                }
            }
            Some(Operand::Entry(Entry {
                descriptor: 0,
                key,
                bare: true,
            }))
        }
        _ => None,
    }
}

/// An unquoted value of the older syntax: the text of its tokens.
fn bare_text(t: &[Token]) -> Option<String> {
    let mut s = String::new();
    for tok in t {
        match tok {
            Token::Ident(i) => s.push_str(i),
            Token::Int(n) => s.push_str(&n.to_string()),
            Token::Sym(sym @ ("." | "/" | "@")) => s.push_str(sym),
            _ => return None,
        }
    }
    (!s.is_empty()).then_some(s)
}

/// A condition, or why Charon does not express it.
pub(super) fn parse_condition(text: &str) -> Result<Condition, String> {
    let cannot = |why: &str| {
        format!(
            "the condition {text:?} is not DESCRIPTOR == 'VALUE' or != 'VALUE' ({why}); Charon's \
             limits compare one entry with one value"
        )
    };
    let t = tokens(text).map_err(|e| cannot(&e))?;
    let ops: Vec<usize> = t
        .iter()
        .enumerate()
        .filter(|(_, tok)| matches!(tok, Token::Sym("==" | "!=" | "&&" | "||")))
        .map(|(i, _)| i)
        .collect();
    let [at] = ops[..] else {
        return Err(cannot("one comparison, no && or ||"));
    };
    let equals = match &t[at] {
        Token::Sym("==") => true,
        Token::Sym("!=") => false,
        _ => return Err(cannot("&& and || are not expressed")),
    };
    let (lhs, rhs) = (&t[..at], &t[at + 1..]);
    let pair = match (operand(lhs), operand(rhs)) {
        (Some(Operand::Entry(e)), Some(Operand::Str(v)))
        | (Some(Operand::Str(v)), Some(Operand::Entry(e))) => Some((e, v, false)),
        _ => None,
    };
    if let Some((entry, value, bare_value)) = pair {
        return Ok(Condition {
            entry,
            equals,
            value,
            bare_value,
        });
    }
    // The older syntax: KEY == VALUE, both unquoted.
    match (operand(lhs), bare_text(rhs)) {
        (Some(Operand::Entry(entry)), Some(value)) if entry.bare => Ok(Condition {
            entry,
            equals,
            value,
            bare_value: true,
        }),
        _ => Err(cannot("an entry compared with a quoted value")),
    }
}

/// A variable, or why Charon does not express it.
pub(super) fn parse_variable(text: &str) -> Result<Entry, String> {
    let cannot = || {
        format!(
            "the variable {text:?} is not a descriptor entry (descriptors[N].KEY); Charon's \
             limits count by entries"
        )
    };
    let t = tokens(text).map_err(|_| cannot())?;
    match operand(&t) {
        Some(Operand::Entry(e)) => Ok(e),
        _ => Err(cannot()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_charon_expresses() {
        let c = parse_condition("descriptors[0]['req.method'] == 'GET'").expect("valid");
        assert_eq!(
            (
                c.entry.descriptor,
                c.entry.key.as_str(),
                c.equals,
                c.value.as_str()
            ),
            (0, "req.method", true, "GET")
        );
        let c = parse_condition("descriptors[1].y != \"2\"").expect("valid");
        assert_eq!(
            (c.entry.descriptor, c.entry.key.as_str(), c.equals),
            (1, "y", false)
        );
        let c = parse_condition("'x' == descriptors[0].k").expect("valid");
        assert_eq!((c.entry.key.as_str(), c.value.as_str()), ("k", "x"));
        let c = parse_condition("req.method == GET").expect("the older syntax");
        assert!(c.entry.bare && c.bare_value);
        assert_eq!(
            (c.entry.key.as_str(), c.value.as_str()),
            ("req.method", "GET")
        );
        let c = parse_condition("descriptors[0]['req.path'] != '/json'").expect("valid");
        assert_eq!(c.value, "/json");
    }

    #[test]
    fn other_cel_is_not_expressed() {
        for text in [
            "descriptors[0].a == '1' && descriptors[0].b == '2'",
            "descriptors[0].a == '1' || descriptors[0].b == '2'",
            "size(descriptors[0].a) > 3",
            "descriptors[0].a.startsWith('x')",
            "descriptors[0].a == 1",
            "!(descriptors[0].a == '1')",
            "descriptors[0].a",
        ] {
            assert!(parse_condition(text).is_err(), "{text}");
        }
        assert!(parse_variable("descriptors[0].a + 'x'").is_err());
        assert_eq!(
            parse_variable("descriptors[2]['user id']")
                .expect("valid")
                .key,
            "user id"
        );
    }
}
