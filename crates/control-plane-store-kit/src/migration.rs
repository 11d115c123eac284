//! The rule both adapters apply to their numbered migrations: apply the ones
//! after the stored version, in order; refuse a store that a newer build has
//! migrated further than this build knows; when the operator owns the
//! migrations, refuse a store that is behind instead of migrating it.

use control_plane_core::{Migrations, StoreError};

/// A numbered migration: its version and its SQL.
pub type Migration = (i64, &'static str);

/// The migrations of `all` (sorted by version) that a store at version
/// `current` still needs.
///
/// # Errors
/// `Unavailable` naming `store` when `current` is newer than the last one
/// this build knows, or when some are pending and `policy` is
/// [`Migrations::Refuse`].
pub fn pending(
    store: &str,
    current: i64,
    all: &'static [Migration],
    policy: Migrations,
) -> Result<&'static [Migration], StoreError> {
    let newest = all.last().map_or(0, |(v, _)| *v);
    if current > newest {
        return Err(StoreError::Unavailable(format!(
            "{store} is at schema version {current}, newer than this build knows ({newest}); run a newer control-plane"
        )));
    }
    let first = all.partition_point(|(v, _)| *v <= current);
    let todo = &all[first..];
    if policy == Migrations::Refuse && !todo.is_empty() {
        return Err(StoreError::Unavailable(format!(
            "{store} is at schema version {current}, this build needs {newest}, and CONTROLPLANE_AUTO_MIGRATE=false: run `control-plane migrate` first"
        )));
    }
    Ok(todo)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: &[Migration] = &[(1, "a"), (2, "b"), (3, "c")];

    #[test]
    fn pending_is_what_comes_after_the_stored_version() {
        let v = |m: &[Migration]| m.iter().map(|(v, _)| *v).collect::<Vec<_>>();
        let apply = Migrations::Apply;
        assert_eq!(v(pending("s", 0, ALL, apply).unwrap()), [1, 2, 3]);
        assert_eq!(v(pending("s", 2, ALL, apply).unwrap()), [3]);
        assert!(pending("s", 3, ALL, apply).unwrap().is_empty());
    }

    #[test]
    fn refusing_stops_a_store_that_is_behind_and_names_the_command() {
        let e = pending("schema cp", 2, ALL, Migrations::Refuse).unwrap_err();
        assert!(matches!(e, StoreError::Unavailable(_)), "{e}");
        assert!(e.to_string().contains("control-plane migrate"), "{e}");
        assert!(
            e.to_string().contains("schema cp is at schema version 2"),
            "{e}"
        );
        assert!(pending("s", 3, ALL, Migrations::Refuse).unwrap().is_empty());
    }

    #[test]
    fn a_newer_store_is_refused_by_name() {
        let e = pending("schema cp", 4, ALL, Migrations::Apply).unwrap_err();
        assert!(matches!(e, StoreError::Unavailable(_)), "{e}");
        assert!(
            e.to_string().contains("schema cp is at schema version 4"),
            "{e}"
        );
        assert!(
            e.to_string().contains("newer than this build knows (3)"),
            "{e}"
        );
    }
}
