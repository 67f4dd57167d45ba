//! Topic exchange routing as a trie of routing-key words.
//!
//! Binding keys are dot-separated words where `*` matches exactly one word and `#` matches zero
//! or more words (AMQP 0-9-1 section 3.1.3.3, RabbitMQ's tutorial 5). Empty words are words too:
//! `a..b` has three words, the middle one empty, and `*` matches it. The empty key, though, has
//! no words (RabbitMQ's `split_topic_key`): `*` does not match it, `#` does.
//!
//! Matching walks the trie once per routing key; the cost depends on the key's length and the
//! number of `#` branches, not on the number of bindings.

use std::collections::HashMap;
use std::hash::Hash;

/// A trie mapping binding keys to the values bound with them.
#[derive(Debug)]
pub struct TopicTrie<V> {
    root: Node<V>,
}

#[derive(Debug)]
struct Node<V> {
    words: HashMap<Box<str>, Node<V>>,
    star: Option<Box<Node<V>>>,
    hash: Option<Box<Node<V>>>,
    values: Vec<V>,
}

impl<V> Default for Node<V> {
    fn default() -> Self {
        Node {
            words: HashMap::new(),
            star: None,
            hash: None,
            values: Vec::new(),
        }
    }
}

impl<V> Default for TopicTrie<V> {
    fn default() -> Self {
        TopicTrie {
            root: Node::default(),
        }
    }
}

impl<V: Clone + Eq + Hash> TopicTrie<V> {
    /// An empty trie.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `value` under binding key `pattern`. Adding the same pair twice stores it once.
    pub fn insert(&mut self, pattern: &str, value: V) {
        let mut node = &mut self.root;
        for word in split_words(pattern) {
            node = match word {
                "*" => node.star.get_or_insert_with(Default::default),
                "#" => node.hash.get_or_insert_with(Default::default),
                w => node.words.entry(w.into()).or_default(),
            };
        }
        if !node.values.contains(&value) {
            node.values.push(value);
        }
    }

    /// Removes `value` from binding key `pattern`; returns whether it was there. Empty branches
    /// are pruned.
    pub fn remove(&mut self, pattern: &str, value: &V) -> bool {
        let words: Vec<&str> = split_words(pattern).collect();
        remove_rec(&mut self.root, &words, value)
    }

    /// Calls `out` for every value whose binding key matches `routing_key`. A value bound under
    /// several matching patterns is reported once per pattern; callers deduplicate.
    pub fn matches(&self, routing_key: &str, out: &mut impl FnMut(&V)) {
        let words: Vec<&str> = split_words(routing_key).collect();
        match_rec(&self.root, &words, out);
    }
}

/// The words of a key. As in RabbitMQ, the empty key has no words at all (so `*` does not match
/// it, `#` does), while `a.` or `.` have empty words.
fn split_words(key: &str) -> impl Iterator<Item = &str> {
    key.split('.').filter(move |_| !key.is_empty())
}

fn remove_rec<V: Eq>(node: &mut Node<V>, words: &[&str], value: &V) -> bool {
    let Some((first, rest)) = words.split_first() else {
        let before = node.values.len();
        node.values.retain(|v| v != value);
        return node.values.len() != before;
    };
    let removed;
    match *first {
        "*" => {
            let Some(child) = node.star.as_mut() else {
                return false;
            };
            removed = remove_rec(child, rest, value);
            if child.is_empty() {
                node.star = None;
            }
        }
        "#" => {
            let Some(child) = node.hash.as_mut() else {
                return false;
            };
            removed = remove_rec(child, rest, value);
            if child.is_empty() {
                node.hash = None;
            }
        }
        w => {
            let Some(child) = node.words.get_mut(w) else {
                return false;
            };
            removed = remove_rec(child, rest, value);
            if child.is_empty() {
                node.words.remove(w);
            }
        }
    }
    removed
}

impl<V> Node<V> {
    fn is_empty(&self) -> bool {
        self.values.is_empty()
            && self.words.is_empty()
            && self.star.is_none()
            && self.hash.is_none()
    }
}

fn match_rec<V>(node: &Node<V>, words: &[&str], out: &mut impl FnMut(&V)) {
    if let Some(h) = &node.hash {
        // '#' consumes zero or more words: try every split point.
        for i in 0..=words.len() {
            match_rec(h, &words[i..], out);
        }
    }
    let Some((first, rest)) = words.split_first() else {
        node.values.iter().for_each(&mut *out);
        return;
    };
    if let Some(child) = node.words.get(*first) {
        match_rec(child, rest, out);
    }
    if let Some(star) = &node.star {
        match_rec(star, rest, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routed(bindings: &[&str], key: &str) -> Vec<String> {
        let mut t = TopicTrie::new();
        for b in bindings {
            t.insert(b, b.to_string());
        }
        let mut out = Vec::new();
        t.matches(key, &mut |v: &String| {
            if !out.contains(v) {
                out.push(v.clone())
            }
        });
        out.sort();
        out
    }

    #[test]
    fn hash_alone_matches_everything() {
        assert_eq!(routed(&["#"], ""), vec!["#"]);
        assert_eq!(routed(&["#"], "a"), vec!["#"]);
        assert_eq!(routed(&["#"], "a.b.c"), vec!["#"]);
    }

    #[test]
    fn prefix_and_suffix_hash() {
        assert_eq!(routed(&["a.#"], "a"), vec!["a.#"]);
        assert_eq!(routed(&["a.#"], "a.b.c"), vec!["a.#"]);
        assert!(routed(&["a.#"], "b.a").is_empty());
        assert_eq!(routed(&["#.b"], "b"), vec!["#.b"]);
        assert_eq!(routed(&["#.b"], "a.x.b"), vec!["#.b"]);
        assert!(routed(&["#.b"], "b.a").is_empty());
        assert_eq!(routed(&["a.#.b"], "a.b"), vec!["a.#.b"]);
        assert_eq!(routed(&["a.#.b"], "a.x.y.b"), vec!["a.#.b"]);
    }

    #[test]
    fn star_is_exactly_one_word() {
        assert_eq!(routed(&["a.*.c"], "a.b.c"), vec!["a.*.c"]);
        assert!(routed(&["a.*.c"], "a.c").is_empty());
        assert!(routed(&["a.*.c"], "a.b.b.c").is_empty());
        assert_eq!(routed(&["a.*.c"], "a..c"), vec!["a.*.c"]);
        assert!(routed(&["*"], "").is_empty());
        assert_eq!(routed(&["*"], "."), Vec::<String>::new());
        assert_eq!(routed(&["*.*"], "."), vec!["*.*"]);
        assert!(routed(&["*"], "a.b").is_empty());
    }

    #[test]
    fn empty_words() {
        assert_eq!(routed(&["a..b"], "a..b"), vec!["a..b"]);
        assert!(routed(&["a..b"], "a.b").is_empty());
        assert_eq!(routed(&[""], ""), vec![""]);
        assert!(routed(&[""], "a").is_empty());
        assert_eq!(routed(&["#.#"], "a"), vec!["#.#"]);
        assert_eq!(routed(&["*.#"], "a"), vec!["*.#"]);
        assert!(routed(&["*.*"], "a").is_empty());
    }

    #[test]
    fn tutorial_five() {
        let b = ["*.orange.*", "*.*.rabbit", "lazy.#"];
        assert_eq!(
            routed(&b, "quick.orange.rabbit"),
            vec!["*.*.rabbit", "*.orange.*"]
        );
        assert_eq!(
            routed(&b, "lazy.orange.elephant"),
            vec!["*.orange.*", "lazy.#"]
        );
        assert_eq!(routed(&b, "quick.orange.fox"), vec!["*.orange.*"]);
        assert_eq!(routed(&b, "lazy.brown.fox"), vec!["lazy.#"]);
        assert_eq!(routed(&b, "lazy.pink.rabbit"), vec!["*.*.rabbit", "lazy.#"]);
        assert!(routed(&b, "quick.brown.fox").is_empty());
        assert!(routed(&b, "orange").is_empty());
        assert!(routed(&b, "quick.orange.new.rabbit").is_empty());
        assert_eq!(routed(&b, "lazy.orange.new.rabbit"), vec!["lazy.#"]);
    }

    #[test]
    fn remove_prunes() {
        let mut t = TopicTrie::new();
        t.insert("a.*.#", 1);
        t.insert("a.*.#", 2);
        assert!(t.remove("a.*.#", &1));
        assert!(!t.remove("a.*.#", &1));
        assert!(!t.remove("a.b", &2));
        let mut n = 0;
        t.matches("a.b.c", &mut |_| n += 1);
        assert_eq!(n, 1);
        assert!(t.remove("a.*.#", &2));
        assert!(t.root.is_empty());
    }
}
