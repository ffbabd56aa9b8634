//! Tower layers for axum (feature `axum`).
