//! Taking turns: one list reordered so that no key's items all come first.

/// `items` in turns by key (`key_of`): the first item of each key, in the
/// order the keys first appear, then the second of each, and so on; each
/// key's own items keep their order.
///
/// Two uses. A claim comes back oldest first, so started as it came one
/// endpoint's backlog would take every free slot: the other endpoints would
/// send nothing until those sends end or park, and a slow one among them
/// would not be learned until then; the worker starts a claim in turns by
/// endpoint. And RFC 8305 tries a name's addresses with the two families
/// alternating, the first address's family first: in turns by family.
pub(crate) fn in_turns<T, K: PartialEq>(items: Vec<T>, key_of: impl Fn(&T) -> K) -> Vec<T> {
    let mut groups: Vec<(K, std::collections::VecDeque<T>)> = Vec::new();
    for item in items {
        let key = key_of(&item);
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, group)) => group.push_back(item),
            None => groups.push((key, std::collections::VecDeque::from([item]))),
        }
    }
    let mut out = Vec::new();
    while !groups.is_empty() {
        for (_, group) in groups.iter_mut() {
            out.extend(group.pop_front());
        }
        groups.retain(|(_, group)| !group.is_empty());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_is_started_in_turns_by_endpoint_each_in_its_own_order() {
        let claimed = vec![("a", 1), ("a", 2), ("a", 3), ("b", 1), ("b", 2), ("c", 1)];
        let started = in_turns(claimed, |(e, _)| *e);
        assert_eq!(
            started,
            vec![("a", 1), ("b", 1), ("c", 1), ("a", 2), ("b", 2), ("a", 3)]
        );
        assert_eq!(in_turns(vec![1, 2, 3], |_| ()), vec![1, 2, 3]);
        assert!(in_turns(Vec::<u8>::new(), |_| ()).is_empty());
    }
}
