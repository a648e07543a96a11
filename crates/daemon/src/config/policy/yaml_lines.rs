//! Line numbers for problems in a policy file. serde_yaml keeps no positions once a document is
//! a value, so the lines come from the text's layout: each item of the top-level `policies:`
//! sequence starts a line with `- ` at one indentation (block or flow items alike), and a field
//! is the first `name:` key within its item's lines. When the layout does not show the items one
//! per line (a whole flow sequence on one line), no line is given rather than a wrong one.

/// Where each policy of a file starts and ends.
pub struct PolicyLines<'a> {
    lines: Vec<&'a str>,
    /// 0-based first line of each item, and the line after its last.
    items: Vec<(usize, usize)>,
}

impl<'a> PolicyLines<'a> {
    /// Finds the `count` items of `policies:` in `text`.
    pub fn new(text: &'a str, count: usize) -> Self {
        let lines: Vec<&str> = text.lines().collect();
        let mut starts = Vec::new();
        if let Some(key) = lines.iter().position(|l| l.starts_with("policies:")) {
            let mut indent = None;
            for (i, line) in lines.iter().enumerate().skip(key + 1) {
                let trimmed = line.trim_start();
                if trimmed.is_empty() || trimmed.starts_with('#') {
                    continue;
                }
                let depth = line.len() - trimmed.len();
                if depth == 0 && !trimmed.starts_with('-') {
                    break; // the next top-level key
                }
                if trimmed.starts_with("- ") || trimmed == "-" {
                    match indent {
                        None => indent = Some(depth),
                        Some(first) if first != depth => continue,
                        Some(_) => {}
                    }
                    starts.push(i);
                }
            }
        }
        let items = if starts.len() == count {
            let ends = starts.iter().skip(1).copied().chain([lines.len()]);
            starts.iter().copied().zip(ends).collect()
        } else {
            Vec::new()
        };
        Self { lines, items }
    }

    /// 1-based line where policy `index` starts.
    pub fn policy(&self, index: usize) -> Option<usize> {
        self.items.get(index).map(|(start, _)| start + 1)
    }

    /// 1-based line of `field` in policy `index`: where it is a key, else where it is a value
    /// (serde names a bad enum value, not its key), else the policy's line (a missing field).
    pub fn field(&self, index: usize, field: &str) -> Option<usize> {
        let &(start, end) = self.items.get(index)?;
        let block = format!("{field}:");
        let flow = [
            format!("{{{field}:"),
            format!(", {field}:"),
            format!(",{field}:"),
        ];
        (start..end)
            .find(|&i| {
                let line = self.lines[i].trim_start();
                let line = line.strip_prefix("- ").unwrap_or(line).trim_start();
                line.starts_with(&block)
            })
            .or_else(|| {
                (start..end).find(|&i| flow.iter().any(|f| self.lines[i].contains(f.as_str())))
            })
            .or_else(|| {
                let value = format!(": {field}");
                (start..end).find(|&i| self.lines[i].contains(&value))
            })
            .map(|i| i + 1)
            .or(Some(start + 1))
    }

    /// 1-based line of entry `item` of the list `field` in policy `index`, when the entries are
    /// written one per line (`- ...` below the field); else the field's line.
    pub fn item(&self, index: usize, field: &str, item: usize) -> Option<usize> {
        let at = self.field(index, field)?;
        let &(_, end) = self.items.get(index)?;
        let depth = |line: &str| line.len() - line.trim_start().len();
        let field_line = self.lines[at - 1].trim_start();
        let field_depth =
            depth(self.lines[at - 1]) + if field_line.starts_with("- ") { 2 } else { 0 };
        // Entries sit deeper than the field, or at its depth (YAML's compact `- ` under a key).
        let is_entry = |line: &str| line.trim_start().starts_with("- ");
        let entries: Vec<usize> = (at..end)
            .take_while(|&i| {
                let line = self.lines[i];
                line.trim().is_empty()
                    || depth(line) > field_depth
                    || (depth(line) == field_depth && is_entry(line))
            })
            .filter(|&i| is_entry(self.lines[i]))
            .collect();
        Some(entries.get(item).map_or(at, |i| i + 1))
    }
}

#[cfg(test)]
mod tests {
    use super::PolicyLines;

    #[test]
    fn items_and_fields_are_found_in_block_and_flow_layouts() {
        let text = "# c\npolicies:\n  - name: a\n    key: [ip]\n    limit: 0\n\n  - {name: b, limit: 5, burst: 3}\nother: 1\n";
        let lines = PolicyLines::new(text, 2);
        assert_eq!(lines.policy(0), Some(3));
        assert_eq!(lines.field(0, "limit"), Some(5));
        assert_eq!(lines.field(0, "name"), Some(3));
        assert_eq!(
            lines.field(0, "period"),
            Some(3),
            "missing: the policy's line"
        );
        assert_eq!(lines.policy(1), Some(7));
        assert_eq!(lines.field(1, "burst"), Some(7));
        assert_eq!(lines.field(0, "[ip]"), Some(4), "a value");
        let windows = "policies:\n  - name: a\n    limits:\n      - {limit: 1, period: 1s}\n\n      - limit: 2\n        period: 1h\n    key: [ip]\n  - name: b\n    limits:\n    - {limit: 1, period: 1s}\n    - {limit: 1, period: 1m}\n";
        let lines = PolicyLines::new(windows, 2);
        assert_eq!(lines.item(0, "limits", 0), Some(4));
        assert_eq!(lines.item(0, "limits", 1), Some(6));
        assert_eq!(
            lines.item(0, "limits", 5),
            Some(3),
            "no such entry: the field"
        );
        assert_eq!(lines.item(1, "limits", 1), Some(12), "compact sequence");
        let one_line = "policies: [{name: a}, {name: b}]\n";
        assert_eq!(PolicyLines::new(one_line, 2).policy(0), None);
    }
}
