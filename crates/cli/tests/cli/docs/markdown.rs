//! Just enough Markdown for the documentation tests: fenced code blocks,
//! inline links, code spans, headings and their GitHub anchors, and the
//! `charon` commands written in code.

use std::collections::BTreeSet;

/// One line of a page.
pub struct Line<'t> {
    /// From 1.
    pub number: usize,
    pub text: &'t str,
    /// Inside a fenced code block (the fences included).
    pub code: bool,
}

/// The page's lines, each marked as code or prose.
pub fn lines(text: &str) -> Vec<Line<'_>> {
    let mut fence: Option<&str> = None;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
        let code = match (fence, marker) {
            (None, Some(m)) => {
                fence = Some(m);
                true
            }
            (Some(f), Some(m))
                if f == m && trimmed.trim_end().chars().all(|c| m.starts_with(c)) =>
            {
                fence = None;
                true
            }
            (Some(_), _) => true,
            (None, None) => false,
        };
        out.push(Line {
            number: i + 1,
            text: line,
            code,
        });
    }
    out
}

/// `line` with every code span blanked out (same length), so that what is
/// written in code is never taken for a link.
fn without_spans(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut inside = false;
    for c in line.chars() {
        if c == '`' {
            inside = !inside;
            out.push(' ');
        } else if inside {
            out.push(' ');
        } else {
            out.push(c);
        }
    }
    out
}

/// Every link target of the prose, with its line: `[text](target)` and
/// reference definitions `[label]: target`.
pub fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for line in lines(text).into_iter().filter(|l| !l.code) {
        let prose = without_spans(line.text);
        let trimmed = prose.trim_start();
        if trimmed.starts_with('[')
            && let Some((label, target)) = trimmed.split_once("]: ")
            && !label.contains(']')
        {
            out.push((line.number, clean_target(target)));
            continue;
        }
        let mut from = 0;
        while let Some(i) = prose[from..].find("](") {
            let start = from + i + 2;
            let end = prose[start..].find(')').map_or(prose.len(), |j| start + j);
            let target = clean_target(&prose[start..end]);
            if !target.is_empty() {
                out.push((line.number, target));
            }
            from = end;
        }
    }
    out
}

/// A link target without `<…>` and without a title.
fn clean_target(target: &str) -> String {
    let target = target.trim();
    let target = target.split_whitespace().next().unwrap_or_default();
    target
        .trim_start_matches('<')
        .trim_end_matches('>')
        .to_owned()
}

/// The anchors GitHub gives the page's headings.
pub fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for line in lines(text).into_iter().filter(|l| !l.code) {
        let hashes = line.text.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line.text[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(&line.text[hashes..]);
        let mut anchor = base.clone();
        let mut n = 0;
        while seen.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        seen.insert(anchor);
    }
    seen
}

/// GitHub's anchor of a heading: its text (links reduced to their text,
/// code marks dropped) in lower case, punctuation but `-` and `_` removed,
/// spaces turned into `-`.
pub fn slug(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading.trim();
    // `[text](url)` → `text`.
    while let Some(open) = rest.find('[') {
        text.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match after.find("](").zip(after.find(')')) {
            Some((close, end)) if close < end => {
                text.push_str(&after[..close]);
                rest = &after[end + 1..];
            }
            _ => {
                text.push('[');
                rest = after;
            }
        }
    }
    text.push_str(rest);
    text.to_lowercase()
        .chars()
        .filter(|&c| c.is_alphanumeric() || c == '-' || c == '_' || c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The code spans of the prose, with the line each starts on (a span may
/// run over a line break, never over a blank line).
pub fn code_spans(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut open: Option<(usize, String)> = None;
    for line in lines(text) {
        if line.code || line.text.trim().is_empty() {
            open = None;
            continue;
        }
        let mut chars = line.text.chars().peekable();
        while let Some(c) = chars.next() {
            match (&mut open, c) {
                (None, '`') => {
                    // A run of backticks opens a span closed by the same
                    // run; treat double backticks as one mark.
                    while chars.peek() == Some(&'`') {
                        chars.next();
                    }
                    open = Some((line.number, String::new()));
                }
                (Some(_), '`') => {
                    while chars.peek() == Some(&'`') {
                        chars.next();
                    }
                    if let Some((n, span)) = open.take() {
                        out.push((n, span.trim().to_owned()));
                    }
                }
                (Some((_, span)), c) => span.push(c),
                (None, _) => {}
            }
        }
        if let Some((_, span)) = &mut open {
            span.push(' ');
        }
    }
    out
}

/// Every `charon` command written in code, with its line: the words after
/// `charon` (its subcommands, flags and values), from code spans and from
/// the lines of code blocks (a line ending in `\`, or indented under a
/// `charon` line, goes on with the next).
pub fn commands(text: &str) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    for (n, span) in code_spans(text) {
        out.extend(commands_in(&span).into_iter().map(|c| (n, c)));
    }
    let all = lines(text);
    let mut i = 0;
    while i < all.len() {
        if !all[i].code {
            i += 1;
            continue;
        }
        let start = all[i].number;
        let mut logical = all[i].text.to_owned();
        while i + 1 < all.len() && all[i + 1].code {
            let next = all[i + 1].text;
            let continued = logical.trim_end().ends_with('\\');
            let indented = next.starts_with(' ') && !commands_in(&logical).is_empty();
            if !continued && !indented {
                break;
            }
            logical = format!("{} {next}", logical.trim_end().trim_end_matches('\\'));
            i += 1;
        }
        out.extend(commands_in(&logical).into_iter().map(|c| (start, c)));
        i += 1;
    }
    out
}

/// The `charon` commands of one shell line: split at `|`, `;`, `&&` and
/// `||` outside brackets, a `#` comment cut off, each segment a command
/// when its first word (after a `$` prompt and `VAR=value` settings) is
/// `charon` or a path ending in `/charon`, or when it runs `cargo … -p
/// charon -- ARGS`.
fn commands_in(line: &str) -> Vec<Vec<String>> {
    let line = match line.find(" # ") {
        Some(i) => &line[..i],
        None => line.strip_suffix(" #").unwrap_or(line),
    };
    let mut segments: Vec<Vec<&str>> = vec![Vec::new()];
    // Inside `[…]` a `|` separates alternatives, not commands.
    let (mut opened, mut closed) = (0, 0);
    for word in line.split_whitespace() {
        if opened <= closed && ["|", ";", "&&", "||", "<", "<<", ">"].contains(&word) {
            segments.push(Vec::new());
            continue;
        }
        opened += word.matches('[').count();
        closed += word.matches(']').count();
        let (word, ends) = match word.strip_suffix(';') {
            Some(word) => (word, true),
            None => (word, false),
        };
        if let Some(last) = segments.last_mut() {
            last.push(word);
        }
        if ends {
            segments.push(Vec::new());
        }
    }
    let mut out = Vec::new();
    for words in segments {
        let words: Vec<&str> = words
            .into_iter()
            .skip_while(|w| {
                *w == "$"
                    || w.split_once('=').is_some_and(|(k, _)| {
                        !k.is_empty() && k.chars().all(|c| c.is_ascii_uppercase() || c == '_')
                    })
            })
            .collect();
        let Some(first) = words.first() else { continue };
        if *first == "charon" || first.ends_with("/charon") {
            out.push(words[1..].iter().map(|w| (*w).to_owned()).collect());
        } else if let Some(i) = words.windows(3).position(|w| w == ["-p", "charon", "--"]) {
            out.push(words[i + 3..].iter().map(|w| (*w).to_owned()).collect());
        }
    }
    out
}
