//! The SVG chart: for every figure reported as a ratio, one horizontal bar
//! per compared scenario showing its ratio to `none` (the line at 1.0).
//! Two panels, since "better" points both ways: throughput and rates
//! (higher is better), then latencies (lower is better). Hand-written SVG,
//! pure.

use super::fmt::{ratio as fmt_ratio, xml};
use super::{targets, View};
use crate::experiment::Better;
use crate::results::Results;
use crate::stats::figure_id;

#[derive(Debug, Clone, PartialEq)]
pub struct ChartRow {
    /// `T1 Gb/s`, `L1 p99 ms`.
    pub label: String,
    /// Figure id, for the bars' `data-figure`.
    pub figure: String,
    pub better: Better,
    /// Ratio to `none` per compared scenario (in the chart's scenario order);
    /// None when it could not be computed.
    pub ratios: Vec<Option<f64>>,
    /// A target ratio, drawn as a dashed mark.
    pub target: Option<f64>,
}

const WIDTH: f64 = 760.0;
const LABEL_W: f64 = 150.0;
const X0: f64 = LABEL_W + 10.0;
const X1: f64 = WIDTH - 70.0;
const BAR_H: f64 = 13.0;
const ROW_GAP: f64 = 7.0;
const PALETTE: [&str; 5] = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2"];

/// The smallest multiple of 0.5 at least 1.1 × the largest ratio (and 1.5).
fn axis_max(rows: &[&ChartRow]) -> f64 {
    let m = rows.iter().flat_map(|r| r.ratios.iter().flatten().copied().chain(r.target)).fold(1.0_f64, f64::max);
    ((m * 1.1) / 0.5).ceil().max(3.0) * 0.5
}

fn tick_step(max: f64) -> f64 {
    if max <= 3.0 {
        0.25
    } else if max <= 6.0 {
        0.5
    } else if max <= 12.0 {
        1.0
    } else {
        (max / 10.0).ceil()
    }
}

pub fn render(title: &str, scenarios: &[String], rows: &[ChartRow]) -> String {
    let mut body = String::new();
    let mut y = 34.0;
    // Legend.
    let mut lx = X0;
    for (i, s) in scenarios.iter().enumerate() {
        body.push_str(&format!(
            "<rect x=\"{lx:.1}\" y=\"{:.1}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{:.1}\" y=\"{:.1}\">{}</text>\n",
            y - 10.0,
            PALETTE[i % PALETTE.len()],
            lx + 16.0,
            y,
            xml(s)
        ));
        lx += 30.0 + 7.0 * s.chars().count() as f64;
    }
    body.push_str(&format!(
        "<line x1=\"{lx:.1}\" y1=\"{:.1}\" x2=\"{lx:.1}\" y2=\"{:.1}\" stroke=\"#333\" stroke-dasharray=\"3,2\"/><text x=\"{:.1}\" y=\"{y:.1}\">target</text>\n",
        y - 11.0,
        y + 2.0,
        lx + 5.0
    ));
    y += 14.0;
    let panels = [
        (Better::Higher, "Throughput and rates, ratio to none (higher is better)"),
        (Better::Lower, "Latency, ratio to none (lower is better)"),
    ];
    for (better, heading) in panels {
        let panel: Vec<&ChartRow> = rows.iter().filter(|r| r.better == better).collect();
        if panel.is_empty() {
            continue;
        }
        y += 22.0;
        body.push_str(&format!("<text x=\"8\" y=\"{y:.1}\" class=\"heading\">{}</text>\n", xml(heading)));
        y += 10.0;
        let max = axis_max(&panel);
        let x = |r: f64| X0 + (X1 - X0) * (r / max).clamp(0.0, 1.0);
        let nbars = scenarios.len().max(1) as f64;
        let row_h = nbars * BAR_H + ROW_GAP;
        let top = y;
        let bottom = y + row_h * panel.len() as f64;
        // Grid and axis labels.
        let step = tick_step(max);
        let mut t = 0.0;
        while t <= max + 1e-9 {
            let gx = x(t);
            let (stroke, width) = if (t - 1.0).abs() < 1e-9 { ("#222", 1.5) } else { ("#ddd", 1.0) };
            body.push_str(&format!(
                "<line x1=\"{gx:.1}\" y1=\"{top:.1}\" x2=\"{gx:.1}\" y2=\"{bottom:.1}\" stroke=\"{stroke}\" stroke-width=\"{width}\"/>\n<text x=\"{gx:.1}\" y=\"{:.1}\" text-anchor=\"middle\" class=\"axis\">{}</text>\n",
                bottom + 12.0,
                if (t - 1.0).abs() < 1e-9 { "1 = none".to_string() } else { format!("{t}") }
            ));
            t += step;
        }
        for row in &panel {
            body.push_str(&format!(
                "<text x=\"{LABEL_W:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\n",
                y + row_h / 2.0,
                xml(&row.label)
            ));
            if let Some(tg) = row.target {
                let tx = x(tg);
                body.push_str(&format!(
                    "<line x1=\"{tx:.1}\" y1=\"{:.1}\" x2=\"{tx:.1}\" y2=\"{:.1}\" stroke=\"#333\" stroke-width=\"1.5\" stroke-dasharray=\"3,2\"/>\n",
                    y - 2.0,
                    y + row_h - ROW_GAP + 1.0
                ));
            }
            for (i, r) in row.ratios.iter().enumerate() {
                let by = y + i as f64 * BAR_H;
                let scenario = scenarios.get(i).map(String::as_str).unwrap_or("");
                let (w, label) = match r {
                    Some(r) => (x(*r) - X0, fmt_ratio(*r)),
                    None => (0.0, "n/a".to_string()),
                };
                body.push_str(&format!(
                    "<rect class=\"bar\" data-scenario=\"{}\" data-figure=\"{}\" x=\"{X0:.1}\" y=\"{by:.1}\" width=\"{w:.1}\" height=\"{:.1}\" fill=\"{}\"/>\n<text x=\"{:.1}\" y=\"{:.1}\" class=\"value\">{}</text>\n",
                    xml(scenario),
                    xml(&row.figure),
                    BAR_H - 2.0,
                    PALETTE[i % PALETTE.len()],
                    X0 + w + 4.0,
                    by + BAR_H - 3.0,
                    label
                ));
            }
            y += row_h;
        }
        y += 16.0;
    }
    let height = y + 8.0;
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height:.0}\" viewBox=\"0 0 {WIDTH} {height:.0}\" font-family=\"sans-serif\" font-size=\"12\">\n\
<style>.heading {{ font-weight: bold; }} .axis {{ font-size: 10px; fill: #555; }} .value {{ font-size: 11px; }}</style>\n\
<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
<text x=\"8\" y=\"18\" class=\"heading\" font-size=\"14\">{}</text>\n{body}</svg>\n",
        xml(title)
    )
}

/// The chart's rows: every figure reported as a ratio.
pub fn rows(r: &Results) -> Vec<ChartRow> {
    let v = View::new(r);
    let compared = v.compared();
    let mut rows = Vec::new();
    for &e in v.experiments() {
        for f in e.figures().iter().filter(|f| f.ratio) {
            let id = figure_id(e, f.key);
            let target = targets::TARGETS.iter().find_map(|t| match t.rule {
                targets::Rule::RatioAtLeast(x) if t.figure == id => Some(x),
                _ => None,
            });
            let label = if f.unit == "ms" { format!("{e} {} ms", f.label) } else { format!("{e} {}", f.unit) };
            rows.push(ChartRow {
                label,
                figure: id.clone(),
                better: f.better,
                ratios: compared.iter().map(|s| v.ratio(s, &id)).collect(),
                target,
            });
        }
    }
    rows
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::experiment::EXPERIMENTS;
    use crate::report::tests::sample;

    /// Minimal XML well-formedness check: tags balance, attributes are
    /// quoted, no stray `<` or `&` in text. Enough for what `render` writes.
    pub fn well_formed(s: &str) -> Result<(), String> {
        let mut stack: Vec<String> = Vec::new();
        let mut rest = s;
        let mut roots = 0;
        while let Some(i) = rest.find(['<', '&']) {
            check_text(&rest[..i])?;
            rest = &rest[i..];
            if rest.starts_with('&') {
                let end = rest.find(';').ok_or("unterminated entity")?;
                let ent = &rest[1..end];
                if !["amp", "lt", "gt", "quot", "apos"].contains(&ent) && !ent.starts_with('#') {
                    return Err(format!("unknown entity &{ent};"));
                }
                rest = &rest[end + 1..];
                continue;
            }
            let end = rest.find('>').ok_or("unterminated tag")?;
            let tag = &rest[1..end];
            rest = &rest[end + 1..];
            if let Some(name) = tag.strip_prefix('/') {
                let open = stack.pop().ok_or_else(|| format!("</{name}> closes nothing"))?;
                if open != name.trim() {
                    return Err(format!("</{name}> closes <{open}>"));
                }
                continue;
            }
            let self_closing = tag.ends_with('/');
            let tag = tag.trim_end_matches('/');
            let name = tag.split_whitespace().next().ok_or("empty tag")?.to_string();
            check_attributes(&tag[name.len()..])?;
            if stack.is_empty() {
                roots += 1;
            }
            if !self_closing {
                stack.push(name);
            }
        }
        check_text(rest)?;
        if !stack.is_empty() {
            return Err(format!("unclosed: {stack:?}"));
        }
        if roots != 1 {
            return Err(format!("{roots} root elements"));
        }
        Ok(())
    }

    fn check_text(t: &str) -> Result<(), String> {
        if t.contains('>') {
            return Err(format!("stray '>' in text {t:?}"));
        }
        Ok(())
    }

    fn check_attributes(mut a: &str) -> Result<(), String> {
        loop {
            a = a.trim_start();
            if a.is_empty() {
                return Ok(());
            }
            let eq = a.find('=').ok_or_else(|| format!("attribute without value in {a:?}"))?;
            let name = &a[..eq];
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == ':') {
                return Err(format!("bad attribute name {name:?}"));
            }
            let v = &a[eq + 1..];
            if !v.starts_with('"') {
                return Err(format!("unquoted attribute {name}"));
            }
            let close = v[1..].find('"').ok_or("unterminated attribute")? + 1;
            if v[1..close].contains(['<', '>']) {
                return Err(format!("unescaped markup in attribute {name}"));
            }
            a = &v[close + 1..];
        }
    }

    fn row(label: &str, better: Better, ratios: Vec<Option<f64>>, target: Option<f64>) -> ChartRow {
        ChartRow { label: label.into(), figure: label.replace(' ', "."), better, ratios, target }
    }

    #[test]
    fn checker_catches_mistakes() {
        assert!(well_formed("<svg><rect x=\"1\"/></svg>").is_ok());
        assert!(well_formed("<svg><g></svg>").is_err());
        assert!(well_formed("<svg><rect x=1/></svg>").is_err());
        assert!(well_formed("<svg>a & b</svg>").is_err());
        assert!(well_formed("<svg/><svg/>").is_err());
    }

    #[test]
    fn one_bar_per_figure_and_scenario() {
        let rows = vec![
            row("T1 Gb/s", Better::Higher, vec![Some(0.2), Some(0.6)], Some(0.5)),
            row("Q1 req/s", Better::Higher, vec![Some(0.45), None], Some(0.5)),
            row("L1 p99 ms", Better::Lower, vec![Some(2.4), Some(1.3)], None),
        ];
        let s = render("Slipstream <bench> & co", &["l4-nft".into(), "l4-ebpf".into()], &rows);
        well_formed(&s).unwrap_or_else(|e| panic!("{e}\n{s}"));
        assert_eq!(s.matches("class=\"bar\"").count(), 6);
        assert_eq!(s.matches("data-scenario=\"l4-ebpf\"").count(), 3);
        assert!(s.contains("Slipstream &lt;bench&gt; &amp; co"));
        assert!(s.contains(">0.20×<") && s.contains(">2.40×<") && s.contains(">n/a<"));
        assert!(s.contains("1 = none"), "the reference line is labelled");
        assert_eq!(s.matches("stroke-dasharray").count(), 3, "legend + two target marks");
        assert!(s.contains("higher is better") && s.contains("lower is better"));
    }

    #[test]
    fn bars_scale_to_the_largest_ratio() {
        let rows = vec![row("L1 p50 ms", Better::Lower, vec![Some(8.0)], None), row("L1 p99 ms", Better::Lower, vec![Some(4.0)], None)];
        let s = render("t", &["l4-nft".into()], &rows);
        well_formed(&s).unwrap();
        let widths: Vec<f64> = s
            .match_indices("class=\"bar\"")
            .map(|(i, _)| {
                let w = &s[i..];
                let w = &w[w.find("width=\"").unwrap() + 7..];
                w[..w.find('"').unwrap()].parse().unwrap()
            })
            .collect();
        assert!((widths[0] / widths[1] - 2.0).abs() < 0.01, "{widths:?}");
        assert!(widths[0] <= X1 - X0);
        assert_eq!(axis_max(&rows.iter().collect::<Vec<_>>()), 9.0);
    }

    #[test]
    fn empty_chart_is_still_an_svg() {
        well_formed(&render("no results", &[], &[])).unwrap();
    }

    #[test]
    fn chart_has_one_bar_per_ratio_figure_and_compared_scenario() {
        let r = sample();
        let svg = super::super::svg(&r);
        well_formed(&svg).unwrap();
        let ratio_figures: usize = EXPERIMENTS.iter().map(|e| e.figures().iter().filter(|f| f.ratio).count()).sum();
        assert_eq!(svg.matches("class=\"bar\"").count(), 3 * ratio_figures, "three compared scenarios (l4-nft, l4-ebpf, l7)");
        let rows = rows(&r);
        assert_eq!(rows.len(), ratio_figures);
        let t1 = rows.iter().find(|x| x.figure == "T1.gbps").unwrap();
        assert_eq!((t1.ratios[..2].to_vec(), t1.target), (vec![Some(0.25), Some(0.5)], Some(0.5)));
        assert!(t1.ratios[2].is_some_and(|r| (r - 0.2).abs() < 1e-9), "l7: {:?}", t1.ratios);
        assert!(svg.contains(">0.25×<") && svg.contains(">4.00×<"));
        assert!(crate::scenario::find("l4-nft").is_some());
    }
}
