//! Tenancy against a real PostgreSQL: roles bound to their apps, the escape
//! suite, the conformance suite as a bound service role and on a store
//! owned by an ordinary role, and the catalog guards tenancy rests on.
//!
//! One binary for the area: each file is a module named for the behaviour
//! it pins.

mod bound_roles;
mod catalog_guards;
mod conformance_as_service_role;
mod conformance_unprivileged_owner;
mod escape;
