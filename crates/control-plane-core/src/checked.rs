//! Requests that the port accepts only after their checks passed.
//!
//! A request with many optional fields (an endpoint, an event, a task, a
//! catalogue entry) is written as a plain struct and sealed with
//! [`Check::checked`]; the port takes the sealed [`Checked`] value, so an
//! adapter receives only checked input and never checks it again (ADR 0031).
//! A request of a few fields is built checked by its own constructor
//! instead (`ClaimRequest::new`, `PageRequest::new`).

use crate::StoreError;

/// A request's checks, written once beside its type.
pub trait Check: Sized {
    /// Whether every field holds what the store accepts.
    ///
    /// # Errors
    /// `InvalidInput` naming the first field that does not.
    fn check(&self) -> Result<(), StoreError>;

    /// The request, sealed once [`Check::check`] passed.
    ///
    /// # Errors
    /// As [`Check::check`].
    fn checked(self) -> Result<Checked<Self>, StoreError> {
        self.check()?;
        Ok(Checked(self))
    }
}

/// A request whose checks passed: readable through `Deref`, not changeable.
#[derive(Clone, Debug, PartialEq)]
pub struct Checked<T>(T);

impl<T> Checked<T> {
    /// The request itself, for an adapter that takes its fields apart.
    pub fn into_inner(self) -> T {
        self.0
    }
}

impl<T: Check> Checked<T> {
    /// Every request sealed, for a batch.
    ///
    /// # Errors
    /// The first refusal, as [`Check::check`] gives it.
    pub fn all(reqs: Vec<T>) -> Result<Vec<Checked<T>>, StoreError> {
        reqs.into_iter().map(Check::checked).collect()
    }
}

impl<T> std::ops::Deref for Checked<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Even(u32);

    impl Check for Even {
        fn check(&self) -> Result<(), StoreError> {
            if self.0.is_multiple_of(2) {
                Ok(())
            } else {
                Err(StoreError::InvalidInput(format!("{} is odd", self.0)))
            }
        }
    }

    #[test]
    fn only_a_request_that_passes_its_check_is_sealed() {
        assert_eq!(Even(4).checked().unwrap().into_inner().0, 4);
        let refused = Even(3).checked().unwrap_err();
        assert!(matches!(refused, StoreError::InvalidInput(m) if m == "3 is odd"));
        let batch = Checked::all(vec![Even(2), Even(6)]).unwrap();
        let kept: Vec<u32> = batch.iter().map(|e| (**e).0).collect();
        assert_eq!(kept, [2, 6]);
        assert!(Checked::all(vec![Even(2), Even(5)]).is_err());
    }
}
