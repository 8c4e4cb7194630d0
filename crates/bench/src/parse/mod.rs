//! Parsers of the load tools' JSON output. Pure: text in, typed results out.

pub mod fortio;
pub mod iperf;

/// Why a tool's output gave no result.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ParseError {
    #[error("no JSON in the output{}", tail(.0))]
    NoJson(String),
    #[error("unexpected JSON: {0}")]
    Json(String),
    #[error("{tool} reported an error: {message}")]
    Tool { tool: &'static str, message: String },
    #[error("{0}")]
    Invalid(String),
}

fn tail(text: &str) -> String {
    let t = text.trim();
    if t.is_empty() {
        " (it was empty)".into()
    } else {
        let start = t.char_indices().rev().nth(300).map(|(i, _)| i).unwrap_or(0);
        format!(": ...{}", &t[start..])
    }
}

/// The JSON object in `text`, which may be preceded by log lines.
fn json_part(text: &str) -> Result<&str, ParseError> {
    let start = text.find('{').ok_or_else(|| ParseError::NoJson(text.to_string()))?;
    let end = text.rfind('}').ok_or_else(|| ParseError::NoJson(text.to_string()))?;
    if end < start {
        return Err(ParseError::NoJson(text.to_string()));
    }
    Ok(&text[start..=end])
}
