//! Topic exchange routing as a trie of routing-key words.
//!
//! Binding keys are dot-separated words where `*` matches exactly one word and `#` matches zero
//! or more words (AMQP 0-9-1 section 3.1.3.3, RabbitMQ's tutorial 5). Empty words are words too:
//! `a..b` has three words, the middle one empty, and `*` matches it. The empty key, though, has
//! no words (RabbitMQ's `split_topic_key`): `*` does not match it, `#` does.
//!
//! Matching walks the trie once per routing key; the cost depends on the key's length and the
//! number of `#` branches, not on the number of bindings.
//!
//! A `#` may absorb any number of words, so a naive walk tries every split point at every `#`
//! of a pattern: `#.a.#.a.#.a.c` against a long key of `a` words explores exponentially many
//! paths (seven `#.a` pairs and a 60-word key took 15 s). The walk instead treats a `#` at key
//! position p as "continue after the `#` at p, or let it absorb one more word", and below a
//! first `#` remembers which (`#` node, position) pairs it has explored, never exploring one
//! twice. Each trie node is then visited at most once per key position: the work is bounded
//! by the number of trie nodes times the number of key words (at most 128, AMQP's 255-byte
//! short string), whatever the patterns. [`TopicTrie::matches_within`] also stops a walk after
//! a given number of node visits, so that a vast set of hostile bindings cannot make one
//! message's routing take long.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hash, Hasher};

/// A trie mapping binding keys to the values bound with them.
#[derive(Debug)]
pub struct TopicTrie<V> {
    root: Node<V>,
}

/// A trie node: 48 bytes plus its values, so that a binding key of its own (one per queue,
/// `user.<id>.#`, is common) costs little.
#[derive(Debug)]
struct Node<V> {
    /// The children by word; boxed, and only once there is one (most nodes are leaves): 8
    /// bytes in every node instead of an empty map's 48.
    #[allow(clippy::box_collection)]
    words: Option<Box<HashMap<Box<str>, Node<V>>>>,
    star: Option<Box<Node<V>>>,
    hash: Option<Box<Node<V>>>,
    values: Vec<V>,
}

impl<V> Default for Node<V> {
    fn default() -> Self {
        Node {
            words: None,
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
                w => node
                    .words
                    .get_or_insert_with(Default::default)
                    .entry(w.into())
                    .or_default(),
            };
        }
        if !node.values.contains(&value) {
            if node.values.is_empty() {
                // Most keys are bound once: no room for more until there are more.
                node.values.reserve_exact(1);
            }
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
        self.matches_counting(routing_key, out);
    }

    /// [`TopicTrie::matches`], visiting at most `*budget` trie nodes; `*budget` is reduced by
    /// the nodes visited. Returns false when the budget ran out before the walk was complete
    /// (some matching values may then not have been reported).
    pub fn matches_within(
        &self,
        routing_key: &str,
        budget: &mut usize,
        out: &mut impl FnMut(&V),
    ) -> bool {
        let words: Vec<&str> = split_words(routing_key).collect();
        let mut walk = Walk {
            explored: HashSet::default(),
            budget: *budget,
            exhausted: false,
        };
        walk.visit(&self.root, &words, false, out);
        *budget = walk.budget;
        !walk.exhausted
    }

    /// [`TopicTrie::matches`], returning the number of trie nodes visited (the matcher's work,
    /// for tests of its complexity).
    pub fn matches_counting(&self, routing_key: &str, out: &mut impl FnMut(&V)) -> usize {
        let mut budget = usize::MAX;
        self.matches_within(routing_key, &mut budget, out);
        usize::MAX - budget
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
            let Some(words) = node.words.as_mut() else {
                return false;
            };
            let Some(child) = words.get_mut(w) else {
                return false;
            };
            removed = remove_rec(child, rest, value);
            if child.is_empty() {
                words.remove(w);
                if words.is_empty() {
                    node.words = None;
                }
            }
        }
    }
    removed
}

impl<V> Node<V> {
    fn is_empty(&self) -> bool {
        self.values.is_empty() && self.words.is_none() && self.star.is_none() && self.hash.is_none()
    }
}

/// One match of a routing key against the trie.
struct Walk {
    /// (`#` node, position) pairs already explored below a first `#`, as the node's address
    /// shifted left by 8 bits plus the position (at most 128).
    explored: HashSet<usize, BuildHasherDefault<AddressHasher>>,
    /// Node visits left.
    budget: usize,
    /// The budget ran out: every further visit returns at once.
    exhausted: bool,
}

impl Walk {
    /// Matches `words` from `node`; `below_hash` once the path went through a `#`, the only
    /// way a node can be reached at the same position twice. Once the budget is spent it sets
    /// `exhausted` and visits nothing more.
    fn visit<V>(
        &mut self,
        node: &Node<V>,
        words: &[&str],
        below_hash: bool,
        out: &mut impl FnMut(&V),
    ) {
        if self.budget == 0 {
            self.exhausted = true;
            return;
        }
        self.budget -= 1;
        if let Some(h) = &node.hash {
            // '#' absorbs zero or more words: continue after it at each position from here
            // on. Positions are explored in increasing order and always to the end (or until
            // the budget is spent, which ends the whole walk), so once one was explored
            // before, so were all later ones.
            let key = &**h as *const Node<V> as usize;
            for i in 0..=words.len() {
                if self.exhausted
                    || (below_hash && !self.explored.insert((key << 8) | (words.len() - i)))
                {
                    break;
                }
                self.visit(h, &words[i..], true, out);
            }
        }
        let Some((first, rest)) = words.split_first() else {
            node.values.iter().for_each(&mut *out);
            return;
        };
        if let Some(child) = node.words.as_ref().and_then(|w| w.get(*first)) {
            self.visit(child, rest, below_hash, out);
        }
        if let Some(star) = &node.star {
            self.visit(star, rest, below_hash, out);
        }
    }
}

/// Hashes the already unique `usize` keys of [`Walk::explored`] with one multiplication.
#[derive(Default)]
struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    fn write_usize(&mut self, n: usize) {
        self.0 = (n as u64)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(26);
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
    fn a_key_of_its_own_costs_two_small_nodes() {
        assert_eq!(
            std::mem::size_of::<Node<crate::exchange::Destination>>(),
            48
        );
        let mut t = TopicTrie::new();
        for i in 0..100 {
            t.insert(&format!("user.{i}.#"), i);
        }
        let user = |t: &TopicTrie<i32>| -> usize {
            let user = &t.root.words.as_ref().unwrap()["user"];
            let leaf = &user.words.as_ref().unwrap()["7"];
            assert!(leaf.words.is_none() && leaf.values.is_empty());
            let hash = leaf.hash.as_ref().unwrap();
            assert_eq!(
                (hash.values.as_slice(), hash.values.capacity()),
                (&[7][..], 1)
            );
            user.words.as_ref().unwrap().len()
        };
        assert_eq!(user(&t), 100);
        for i in 0..100 {
            assert!(t.remove(&format!("user.{i}.#"), &i));
        }
        assert!(t.root.is_empty() && t.root.words.is_none());
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

    /// The specification as a direct recursion over pattern and key words (exponential, for
    /// small inputs only).
    fn reference(pattern: &[&str], key: &[&str]) -> bool {
        match pattern.split_first() {
            None => key.is_empty(),
            Some((&"#", rest)) => (0..=key.len()).any(|i| reference(rest, &key[i..])),
            Some((&"*", rest)) => !key.is_empty() && reference(rest, &key[1..]),
            Some((w, rest)) => key.first() == Some(w) && reference(rest, &key[1..]),
        }
    }

    #[test]
    fn agrees_with_reference_on_random_patterns() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let pattern_words = ["a", "b", "*", "#", ""];
        let key_words = ["a", "b", ""];
        for _ in 0..300 {
            let mut t = TopicTrie::new();
            let patterns: Vec<String> = (0..rng.gen_range(1..8))
                .map(|_| {
                    let n = rng.gen_range(0..6);
                    let w: Vec<&str> = (0..n)
                        .map(|_| pattern_words[rng.gen_range(0..pattern_words.len())])
                        .collect();
                    w.join(".")
                })
                .collect();
            for p in &patterns {
                t.insert(p, p.clone());
            }
            for _ in 0..20 {
                let n = rng.gen_range(0..7);
                let key: Vec<&str> = (0..n)
                    .map(|_| key_words[rng.gen_range(0..key_words.len())])
                    .collect();
                let key = key.join(".");
                let key_split: Vec<&str> = split_words(&key).collect();
                let mut want: Vec<&String> = patterns
                    .iter()
                    .filter(|p| reference(&split_words(p).collect::<Vec<_>>(), &key_split))
                    .collect();
                want.sort();
                want.dedup();
                let mut got = Vec::new();
                t.matches(&key, &mut |v: &String| {
                    if !got.contains(&v.clone()) {
                        got.push(v.clone())
                    }
                });
                got.sort();
                let want: Vec<String> = want.into_iter().cloned().collect();
                assert_eq!(got, want, "patterns {patterns:?}, key {key:?}");
            }
        }
    }

    #[test]
    fn nested_hashes_take_polynomial_work() {
        // Seven `#.a` pairs against 60 words `a` then `b`: the naive walk explores billions
        // of paths; the memoized one visits each (node, position) pair a bounded number of
        // times.
        let pattern = "#.a.#.a.#.a.#.a.#.a.#.a.#.a.c";
        let mut t = TopicTrie::new();
        t.insert(pattern, 1);
        let key = format!("{}b", "a.".repeat(60));
        let mut hits = 0;
        let visits = t.matches_counting(&key, &mut |_| hits += 1);
        assert_eq!(hits, 0);
        // At most one visit per (trie node, key position): 15 nodes x 62 positions (the
        // unmemoized walk visits more than 10^9 nodes here).
        assert!(visits <= 15 * 62, "{visits} visits");
        // And a key the pattern does match still matches.
        let key = format!("{}c", "a.".repeat(60));
        let mut hits = 0;
        t.matches(&key, &mut |_| hits += 1);
        assert!(hits >= 1);
        // The longest keys AMQP allows (a 255-byte short string: 128 words) stay bounded.
        let key = format!("{}b", "a.".repeat(127));
        let visits = t.matches_counting(&key, &mut |_| {});
        assert!(visits <= 15 * 129, "{visits} visits");
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
