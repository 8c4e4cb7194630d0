use std::fmt;

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

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.source)?;
        if self.document > 1 {
            write!(f, " (document {})", self.document)?;
        }
        if let Some(o) = &self.object {
            write!(f, ": {o}")?;
        }
        if !self.field.is_empty() {
            write!(f, ": {}", self.field)?;
        }
        write!(f, ": {}", self.message)
    }
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
