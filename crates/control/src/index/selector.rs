//! Objects with a label selector (Services, AuthorizationPolicies), filed
//! under one pair of it: the candidates for a set of labels are the
//! objects filed under one of its pairs, then checked in full by the
//! caller. No event scans every object of a namespace.

use crate::translate::Labels;
use std::collections::{BTreeSet, HashMap};

/// Names of objects by the first pair of their selector.
#[derive(Default)]
pub(super) struct SelectorIndex(HashMap<(String, String), BTreeSet<String>>);

impl SelectorIndex {
    fn key(selector: &Labels) -> Option<(String, String)> {
        selector.iter().next().map(|(k, v)| (k.clone(), v.clone()))
    }

    /// Files `name` under its selector (nothing without one, or with an
    /// empty one).
    pub(super) fn insert(&mut self, name: &str, selector: Option<&Labels>) {
        if let Some(k) = selector.and_then(Self::key) {
            self.0.entry(k).or_default().insert(name.to_string());
        }
    }

    /// Takes `name` out, filed as it was under `selector`.
    pub(super) fn remove(&mut self, name: &str, selector: Option<&Labels>) {
        if let Some(k) = selector.and_then(Self::key) {
            if let Some(set) = self.0.get_mut(&k) {
                set.remove(name);
                if set.is_empty() {
                    self.0.remove(&k);
                }
            }
        }
    }

    /// The objects whose selector may match `labels` (a superset: the
    /// caller checks the selector in full).
    pub(super) fn candidates<'a>(&'a self, labels: &'a Labels) -> impl Iterator<Item = &'a String> + 'a {
        labels.iter().filter_map(|(k, v)| self.0.get(&(k.clone(), v.clone()))).flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    /// A pod's labels, the candidates expected.
    type Case = (&'static [(&'static str, &'static str)], &'static [&'static str]);

    #[test]
    fn candidates_are_those_filed_under_one_of_the_pairs() {
        let mut ix = SelectorIndex::default();
        ix.insert("web", Some(&labels(&[("app", "web")])));
        ix.insert("web-v1", Some(&labels(&[("app", "web"), ("version", "v1")])));
        ix.insert("db", Some(&labels(&[("app", "db")])));
        ix.insert("none", None);
        ix.insert("empty", Some(&Labels::new()));
        let cases: &[Case] = &[
            (&[("app", "web")], &["web", "web-v1"]),
            (&[("app", "db"), ("version", "v1")], &["db"]),
            (&[("version", "v1")], &[]),
            (&[], &[]),
        ];
        for (pod, want) in cases {
            let pod = labels(pod);
            let mut got: Vec<&str> = ix.candidates(&pod).map(String::as_str).collect();
            got.sort_unstable();
            assert_eq!(got, *want, "{pod:?}");
        }
        ix.remove("web", Some(&labels(&[("app", "web")])));
        ix.remove("db", Some(&labels(&[("app", "db")])));
        assert_eq!(ix.candidates(&labels(&[("app", "web")])).collect::<Vec<_>>(), ["web-v1"]);
        assert!(!ix.0.contains_key(&("app".to_string(), "db".to_string())), "an empty entry is dropped");
    }
}
