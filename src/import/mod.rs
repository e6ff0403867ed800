//! `sluice import`: configurations written from what another proxy was
//! told, so a team moving its limits into sluice starts from the limits
//! it has. Each source is a folder of its own; what a source said that
//! sluice cannot do is written into the output as a comment, never
//! dropped without a word.

pub mod ingress_nginx;
