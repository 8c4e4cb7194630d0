use crate::names::SHOWN_CHARS;
use std::fmt;

/// One field of one object that is wrong, and why (what validation
/// returns; the loader places it in its file as a [`ManifestError`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

/// One problem in one manifest, located as precisely as we can.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestError {
    /// File path (or `<stdin>`, or a test label).
    pub source: String,
    /// 1-based YAML document index inside the file.
    pub document: usize,
    /// `Kind namespace/name` when known.
    pub object: Option<String>,
    /// Dotted field path (`spec.template.spec.containers[0].command`), empty
    /// when the problem is the document as a whole.
    pub field: String,
    pub message: String,
}

impl ManifestError {
    /// `file` or `file (document N)`: where an object was found.
    pub fn place(&self) -> String {
        if self.document > 1 {
            format!("{} (document {})", self.source, self.document)
        } else {
            self.source.clone()
        }
    }
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.place())?;
        if let Some(o) = &self.object {
            write!(f, ": {}", cut(o, 2 * SHOWN_CHARS))?;
        }
        if !self.field.is_empty() {
            write!(f, ": {}", cut(&self.field, 2 * SHOWN_CHARS))?;
        }
        write!(f, ": {}", cut(&elide_quoted(&self.message), 8 * SHOWN_CHARS))
    }
}

/// Cuts `s` to `max` characters, saying how long it was.
fn cut(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let head: String = s.chars().take(max).collect();
    format!("{head}... ({} bytes)", s.len())
}

/// Shortens every quoted value (`"..."` or `` `...` ``) longer than
/// `SHOWN_CHARS` in a message, such as the value a YAML parser echoes in a
/// type error, so that an error never repeats a huge value whole.
pub fn elide_quoted(msg: &str) -> String {
    let chars: Vec<char> = msg.chars().collect();
    let mut out = String::with_capacity(msg.len().min(4096));
    let mut i = 0;
    while i < chars.len() {
        let q = chars[i];
        if q == '"' || q == '`' {
            // Find the closing quote, skipping escaped ones.
            let mut j = i + 1;
            while j < chars.len() && !(chars[j] == q && chars[j - 1] != '\\') {
                j += 1;
            }
            if j < chars.len() && j - i - 1 > SHOWN_CHARS {
                let inner: String = chars[i + 1..j].iter().collect();
                let head: String = chars[i + 1..i + 1 + SHOWN_CHARS].iter().collect();
                out.push_str(&format!("{q}{head}{q}... ({} bytes)", inner.len()));
                i = j + 1;
                continue;
            }
            if j < chars.len() {
                out.extend(&chars[i..=j]);
                i = j + 1;
                continue;
            }
        }
        out.push(q);
        i += 1;
    }
    out
}

/// All the problems found in one load; loading reports every error at once
/// rather than making the user fix them one run at a time.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ManifestErrors(pub Vec<ManifestError>);

impl fmt::Display for ManifestErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl ManifestErrors {
    pub fn single(e: ManifestError) -> Self {
        ManifestErrors(vec![e])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_values_are_elided_everywhere() {
        let big = "v".repeat(1 << 20);
        let m = elide_quoted(&format!("invalid type: string \"{big}\", expected i64; unknown variant `{big}`"));
        assert!(m.len() < 400, "{}", m.len());
        assert!(m.starts_with("invalid type: string \"vvvv") && m.contains("\"... (1048576 bytes), expected i64"), "{m}");
        assert!(m.contains("`... (1048576 bytes)"), "{m}");
        assert_eq!(elide_quoted("short \"ok\" and `fine`"), "short \"ok\" and `fine`");
        assert_eq!(elide_quoted("unbalanced \"quote"), "unbalanced \"quote");
        let e = ManifestError {
            source: "f.yaml".into(),
            document: 2,
            object: Some(format!("Pod default/{big}")),
            field: format!("metadata.labels[{big}]"),
            message: format!("{big} is longer than 63 characters"),
        };
        let s = e.to_string();
        assert!(s.len() < 1500 && s.starts_with("f.yaml (document 2): Pod default/vvv"), "{}", s.len());
    }
}
