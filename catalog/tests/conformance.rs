//! The stores' conformance suite (psych-store-conformance) run against the redb catalogue,
//! in memory and in a file: the guarantees the PostgreSQL store is held to as well.

mod in_memory {
    psych_store_conformance::catalog_conformance!(
        || psych_catalog::Catalog::in_memory().unwrap_or_else(|e| panic!("{e}"))
    );
}

mod in_a_file {
    use psych_store_conformance::Kept;

    /// A catalogue in a file of a folder of its own, removed with the store.
    fn open() -> Kept<psych_catalog::Catalog, tempfile::TempDir> {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let catalog = psych_catalog::Catalog::open(dir.path().join("catalog.redb"))
            .unwrap_or_else(|e| panic!("{e}"));
        Kept(catalog, dir)
    }

    psych_store_conformance::catalog_conformance!(open);
}

/// The catalogue over a store of the seam ([`Catalog::shared`](psych_catalog::Catalog::shared)),
/// here the in-memory one erased: every call goes through the store and keeps its guarantees.
mod shared_over_a_store {
    psych_store_conformance::catalog_conformance!(|| {
        let store = psych_catalog::Catalog::in_memory().unwrap_or_else(|e| panic!("{e}"));
        psych_catalog::Catalog::shared(std::sync::Arc::new(psych_types::Erased(store)))
    });
}
