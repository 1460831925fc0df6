//! What the audit trail records of a commit besides the whole
//! configuration as normalized YAML (the form `GET /v1/config?format=yaml`
//! exports and rollback imports, built by `store::assemble`): a
//! unified diff of it, before → after.

/// Lines of context around each change in a recorded diff.
const CONTEXT: usize = 3;

/// A unified diff from `before` to `after` (`a/config.yaml` → `b/…`, with
/// hunk headers), empty when they are equal.
pub(crate) fn unified(before: &str, after: &str) -> String {
    similar::TextDiff::from_lines(before, after)
        .unified_diff()
        .context_radius(CONTEXT)
        .header("a/config.yaml", "b/config.yaml")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diffs_are_unified() {
        let d = unified("a: 1\nb: 2\n", "a: 1\nb: 3\n");
        assert!(
            d.starts_with("--- a/config.yaml\n+++ b/config.yaml\n@@"),
            "{d}"
        );
        assert!(d.contains("\n-b: 2\n+b: 3\n"), "{d}");
        assert_eq!(unified("x\n", "x\n"), "");
    }
}
