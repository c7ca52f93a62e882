"""GX Data Docs: the one ephemeral Great Expectations context of a process, with the Data Docs
site it renders validations into (`gx_context`), and the rendering of a validation's page
(`publish`). GX is imported inside functions only: it takes seconds, and the code location must
load without it.
"""

import functools
import logging
from pathlib import Path
from typing import Any

_DOCS_SITE = "local"


@functools.cache
def gx_context(data_docs_dir: str) -> Any:
    """One ephemeral GX context per process: building one per partition would cost more than
    the validation itself."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    # GX logs every metric batch at INFO and warns on usage-statistics setup; keep runs readable.
    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    context = gx.get_context(mode="ephemeral")
    # The "Calculating Metrics" tqdm bar would otherwise land in every run's stderr log.
    context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    context.add_data_docs_site(
        site_name=_DOCS_SITE,
        site_config={
            "class_name": "SiteBuilder",
            "store_backend": {
                "class_name": "TupleFilesystemStoreBackend",
                "base_directory": str(Path(data_docs_dir).resolve()),
            },
            "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
        },
    )
    context.data_sources.add_pandas("frames")
    return context


def publish(context: Any, data_docs_dir: str) -> str | None:
    """Render the latest validation into the Data Docs site; its page's URL."""
    identifier = context.validation_results_store.list_keys()[-1]
    try:
        urls = context.build_data_docs(site_names=[_DOCS_SITE], resource_identifiers=[identifier])
    finally:
        # The in-memory store would otherwise grow with every partition this process validates.
        context.validation_results_store.remove_key(identifier)
    index = urls.get(_DOCS_SITE)
    if index is None:
        return None
    page = Path(data_docs_dir, "validations", *identifier.to_tuple()).with_suffix(".html")
    return page.as_uri() if page.is_file() else index
