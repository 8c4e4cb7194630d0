//! `describe`: each object's names, labels, annotations, spec and status.

use super::select::{name_of, namespace_of, objects, select, wanted, Scope};
use crate::common::Ctx;

/// `describe KIND [NAME...]`.
pub fn describe(ctx: &Ctx, resources: &[String], scope: Scope) -> anyhow::Result<()> {
    let wanted = wanted(resources).map_err(anyhow::Error::msg)?;
    let all = objects(ctx)?;
    let mut out = Vec::new();
    for w in &wanted {
        for o in select(&all, w, &scope).map_err(anyhow::Error::msg)? {
            let kv = |field: &str| {
                o["metadata"][field]
                    .as_object()
                    .filter(|m| !m.is_empty())
                    .map(|m| m.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or(""))).collect::<Vec<_>>().join("\n             "))
                    .unwrap_or_else(|| "<none>".into())
            };
            let mut text = format!("Name:        {}\n", name_of(o));
            if w.kind.namespaced {
                text.push_str(&format!("Namespace:   {}\n", namespace_of(o)));
            }
            text.push_str(&format!("Kind:        {}\nLabels:      {}\nAnnotations: {}\n", w.kind.kind, kv("labels"), kv("annotations")));
            for part in ["spec", "status"] {
                if o[part].is_object() {
                    let y = serde_yaml::to_string(&o[part])?;
                    text.push_str(&format!("{}{}:\n", &part[..1].to_uppercase(), &part[1..]));
                    text.push_str(&y.lines().map(|l| format!("  {l}\n")).collect::<String>());
                }
            }
            text.push_str("Events:      <none>\n");
            out.push(text);
        }
    }
    if out.is_empty() {
        eprintln!("No resources found in {} namespace.", scope.ns());
    }
    print!("{}", out.join("\n\n"));
    Ok(())
}
