//! Rust source as tokens for the house check: identifiers, `::` and
//! punctuation with their lines; comments, strings, chars and numbers left
//! out, so that nothing written in them counts as code.

/// One token of Rust source, with the line it starts on.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Tok {
    Ident(String),
    /// `::`
    Colons,
    Punct(char),
}

#[derive(Debug, Clone)]
pub(super) struct Token {
    pub(super) tok: Tok,
    pub(super) line: usize,
}

impl Token {
    pub(super) fn is_ident(&self, name: &str) -> bool {
        matches!(&self.tok, Tok::Ident(i) if i == name)
    }

    pub(super) fn is_punct(&self, c: char) -> bool {
        self.tok == Tok::Punct(c)
    }
}

/// The source's tokens, comments, strings, chars and numbers left out.
pub(super) fn tokens(text: &str) -> Vec<Token> {
    let chars: Vec<char> = text.chars().collect();
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    // Skips a string body from `i` (just after the opening quote) to
    // past the closing quote followed by `hashes` `#`s.
    let skip_string = |i: &mut usize, line: &mut usize, hashes: usize, escapes: bool| {
        while *i < chars.len() {
            let c = chars[*i];
            if c == '\n' {
                *line += 1;
            }
            if escapes && c == '\\' {
                if at(*i + 1) == '\n' {
                    *line += 1;
                }
                *i += 2;
                continue;
            }
            *i += 1;
            if c == '"' && (0..hashes).all(|h| at(*i + h) == '#') {
                *i += hashes;
                return;
            }
        }
    };
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && at(i + 1) == '/' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if chars[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
        } else if c == '"' {
            i += 1;
            skip_string(&mut i, &mut line, 0, true);
        } else if c == '\'' {
            if at(i + 1) == '\\' {
                // An escaped char: '\n', '\'', '\u{…}'.
                i += 3;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if at(i + 2) == '\'' {
                i += 3;
            } else {
                // A lifetime: its name follows as an identifier.
                i += 1;
            }
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let ident: String = chars[start..i].iter().collect();
            let hashes = chars[i..].iter().take_while(|&&c| c == '#').count();
            match ident.as_str() {
                "r" | "br" | "cr" if at(i + hashes) == '"' => {
                    i += hashes + 1;
                    skip_string(&mut i, &mut line, hashes, false);
                }
                "b" | "c" if at(i) == '"' => {
                    i += 1;
                    skip_string(&mut i, &mut line, 0, true);
                }
                "b" if at(i) == '\'' => {
                    // A byte char: the `'` branch above skips it next.
                }
                _ => out.push(Token {
                    tok: Tok::Ident(ident),
                    line,
                }),
            }
        } else if c.is_ascii_digit() {
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
        } else if c == ':' && at(i + 1) == ':' {
            out.push(Token {
                tok: Tok::Colons,
                line,
            });
            i += 2;
        } else {
            out.push(Token {
                tok: Tok::Punct(c),
                line,
            });
            i += 1;
        }
    }
    out
}

/// Whether a test-only attribute starts at `i`: `#[cfg(test)]` or
/// `#[cfg(any(test, …))]` (test support behind a feature).
pub(super) fn cfg_test_at(toks: &[Token], i: usize) -> bool {
    let is = |k: usize, w: &str| {
        toks.get(i + k).is_some_and(|t| match &t.tok {
            Tok::Ident(s) => s == w,
            Tok::Punct(c) => w.len() == 1 && w.starts_with(*c),
            Tok::Colons => false,
        })
    };
    let start = ["#", "[", "cfg", "("]
        .iter()
        .enumerate()
        .all(|(k, w)| is(k, w));
    start && (is(4, "test") && is(5, ")") || is(4, "any") && is(5, "(") && is(6, "test"))
}

/// The index just past the item starting at `i` (its attributes first):
/// past its first `;` or its first `{ … }` at the item's own level.
pub(super) fn skip_item(toks: &[Token], mut i: usize) -> usize {
    let mut depth = 0usize;
    while i < toks.len() {
        match &toks[i].tok {
            Tok::Punct('(' | '[') => depth += 1,
            Tok::Punct(')' | ']') => depth = depth.saturating_sub(1),
            Tok::Punct(';') if depth == 0 => return i + 1,
            Tok::Punct('{') if depth == 0 => {
                let mut braces = 0usize;
                while i < toks.len() {
                    if toks[i].is_punct('{') {
                        braces += 1;
                    } else if toks[i].is_punct('}') {
                        braces -= 1;
                        if braces == 0 {
                            return i + 1;
                        }
                    }
                    i += 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    i
}
