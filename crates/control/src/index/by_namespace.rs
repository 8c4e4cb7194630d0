//! What each view keeps per namespace: an entry made on first use and
//! forgotten once nothing of its namespace is left, so namespaces that
//! come and go leave nothing behind. One type for every view, instead of
//! the same two methods in each.

use std::collections::BTreeMap;
use std::ops::{Deref, DerefMut};

/// What a view keeps of one namespace.
pub(super) trait NsState: Default {
    /// Nothing of the namespace is left in this view.
    fn is_empty(&self) -> bool;
}

/// A view's state by namespace name, in name order.
pub(super) struct ByNamespace<T>(BTreeMap<String, T>);

impl<T> Default for ByNamespace<T> {
    fn default() -> Self {
        ByNamespace(BTreeMap::new())
    }
}

impl<T: NsState> ByNamespace<T> {
    /// The namespace's entry, made empty when it has none.
    pub(super) fn ns_mut(&mut self, name: &str) -> &mut T {
        self.0.entry(name.to_string()).or_default()
    }

    /// Drops the namespace's entry once nothing of it is left.
    pub(super) fn forget_if_empty(&mut self, name: &str) {
        if self.0.get(name).is_some_and(T::is_empty) {
            self.0.remove(name);
        }
    }
}

impl<T> Deref for ByNamespace<T> {
    type Target = BTreeMap<String, T>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl<T> DerefMut for ByNamespace<T> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl<'a, T> IntoIterator for &'a ByNamespace<T> {
    type Item = (&'a String, &'a T);
    type IntoIter = std::collections::btree_map::Iter<'a, String, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Names(Vec<String>);
    impl NsState for Names {
        fn is_empty(&self) -> bool {
            self.0.is_empty()
        }
    }

    #[test]
    fn an_entry_is_made_on_use_and_forgotten_once_empty() {
        let mut m = ByNamespace::<Names>::default();
        m.ns_mut("a").0.push("x".into());
        m.ns_mut("b");
        m.forget_if_empty("a");
        m.forget_if_empty("b");
        m.forget_if_empty("never");
        assert_eq!(m.keys().collect::<Vec<_>>(), ["a"], "a still holds x; b was empty");
        m.ns_mut("a").0.clear();
        m.forget_if_empty("a");
        assert!(m.is_empty());
    }
}
