//! Number and text formatting shared by the table and the chart. Pure.

/// A figure with as many decimals as it deserves: 13.43, 105.2, 10712.
pub fn num(v: f64) -> String {
    if !v.is_finite() {
        return "n/a".into();
    }
    let a = v.abs();
    if a >= 1000.0 {
        format!("{v:.0}")
    } else if a >= 100.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// `0.20×`
pub fn ratio(r: f64) -> String {
    format!("{r:.2}×")
}

/// `+2.93` / `-0.10`
pub fn signed(v: f64) -> String {
    format!("{}{v:.2}", if v >= 0.0 { "+" } else { "" })
}

/// Escapes text for XML content and attribute values.
pub fn xml(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

/// Escapes `|` so that text stays inside its Markdown table cell.
pub fn cell(s: &str) -> String {
    s.replace('|', "\\|")
}

/// The recorded command, run from the build directory, without `--out`
/// (where the files went changes no figure).
pub fn reproduce_command(command: &str) -> String {
    let mut out = Vec::new();
    let mut words = command.split(' ');
    while let Some(w) = words.next() {
        if w == "--out" {
            words.next();
        } else if !w.starts_with("--out=") {
            out.push(w);
        }
    }
    out.join(" ").replacen("slipstream ", "/var/tmp/slipstream-target/release/slipstream ", 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers() {
        assert_eq!(num(13.4279), "13.43");
        assert_eq!(num(105.24), "105.2");
        assert_eq!(num(10712.18), "10712");
        assert_eq!(num(0.0), "0.00");
        assert_eq!(num(f64::NAN), "n/a");
        assert_eq!(ratio(0.19643), "0.20×");
        assert_eq!(signed(2.934), "+2.93");
        assert_eq!(signed(-0.1), "-0.10");
    }

    #[test]
    fn escaping() {
        assert_eq!(xml("a<b & \"c\""), "a&lt;b &amp; &quot;c&quot;");
        assert_eq!(cell("x|y"), "x\\|y");
    }

    #[test]
    fn reproduce_command_drops_the_output_directory() {
        assert_eq!(
            reproduce_command("slipstream bench --out /tmp/x --update-docs --out=y --reps 5"),
            "/var/tmp/slipstream-target/release/slipstream bench --update-docs --reps 5"
        );
    }
}
