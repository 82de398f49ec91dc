"""Model revisions, the catalog and private deployments (docs/API.md "Models and deployments")."""

from __future__ import annotations

from django.core.validators import MinValueValidator
from django.db import models

from boardwalk import clock
from boardwalk.ids import new_id
from boardwalk.models import Organization

MODALITIES = ("text", "image", "audio")


def _revision_id() -> str:
    return new_id("mcfg_")


def _deployment_id() -> str:
    return new_id("dep_")


class ModelRevision(models.Model):
    """One immutable serving configuration. Never edited: a change is a new revision."""

    id = models.CharField(primary_key=True, max_length=40, default=_revision_id, editable=False)
    label = models.CharField(max_length=200, help_text="Human name, e.g. tiny-chat@2026-11-30.")
    weights = models.CharField(
        max_length=500, help_text="Local directory, or a hub id already present in the local cache."
    )
    weights_revision = models.CharField(max_length=100, blank=True)
    tokenizer = models.CharField(
        max_length=500, blank=True, help_text="Tokenizer location; blank means the weights'."
    )
    chat_template = models.TextField(blank=True, help_text="Blank means the tokenizer's own.")
    context_length = models.PositiveIntegerField()
    dtype = models.CharField(max_length=16, default="auto")
    modalities = models.JSONField(default=list)
    dialect = models.CharField(
        max_length=32,
        default="plain",
        help_text="How the model writes reasoning, tool calls and the end of its turn "
        '(docs/API.md "Model dialects"); chosen from the chat template when the revision '
        "is created. A dialect without a tool syntax takes no `tools`.",
    )
    tensor_parallel_size = models.PositiveSmallIntegerField(
        default=1,
        validators=[MinValueValidator(1)],
        help_text="GPUs of one machine the engine is split across (transformers' tensor "
        "parallelism); 1 runs it on one device.",
    )
    # An external engine (inference/external/): an OpenAI-compatible server answers the
    # revision's rows; `weights` and `tokenizer` then name its tokenizer directory (config,
    # tokenizer, chat template, no weights), which counting and upload validation read as for
    # a local revision. Blank `engine_url`: Boardwalk's own engine loads `weights`.
    engine_url = models.CharField(
        max_length=500,
        blank=True,
        help_text="An OpenAI-compatible server's base URL (…/v1) that answers this revision's "
        "rows; blank: Boardwalk's own engine loads the weights.",
    )
    engine_model = models.CharField(
        max_length=300, blank=True, help_text="The model id the server lists at /v1/models."
    )
    engine_api_key_env = models.CharField(
        max_length=100,
        blank=True,
        help_text="The environment variable that holds the server's API key (the key itself "
        "is never stored); blank: the server takes none.",
    )
    max_in_flight = models.PositiveIntegerField(
        default=32,
        validators=[MinValueValidator(1)],
        help_text="External engine: the most rows in flight at once across all workers (the "
        "cap of the adaptive in-flight limit).",
    )
    engine_gpus = models.PositiveIntegerField(
        default=0,
        help_text="External engine: the GPUs the server holds for this revision, as the "
        "operator declares them (a private deployment on it is charged these GPUs for the "
        "time its requests are in flight); 0: not declared.",
    )
    created_at = models.DateTimeField(default=clock.now, editable=False)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(engine_url="", engine_model="")
                | (~models.Q(engine_url="") & ~models.Q(engine_model="")),
                name="revision_engine_url_and_model_together",
            )
        ]

    def __str__(self) -> str:
        return f"{self.label} ({self.id})"

    @property
    def is_external(self) -> bool:
        """Whether an external engine answers this revision's rows (`engine_url`)."""
        return bool(self.engine_url)


class CatalogModel(models.Model):
    """A public model name and its current serving revision and batch prices."""

    name = models.CharField(max_length=200, unique=True)
    revision = models.ForeignKey(ModelRevision, on_delete=models.PROTECT, related_name="+")
    batch_enabled = models.BooleanField(default=True, help_text="Off means `batch: null`.")
    enabled = models.BooleanField(
        default=True,
        help_text="Off: no new batches or interactive requests (`manage.py model disable`); "
        "accepted batches keep running.",
    )
    price_input = models.BigIntegerField(default=0, help_text="microusd per million tokens")
    price_cached_input = models.BigIntegerField(default=0, help_text="microusd per million tokens")
    price_output = models.BigIntegerField(default=0, help_text="microusd per million tokens")
    # Interactive requests (POST /v1/chat/completions) pay these; flex ones the batch prices.
    # NULL: the model is not offered interactively (inference.selectors.model_resolve).
    price_input_interactive = models.BigIntegerField(
        null=True, blank=True, help_text="microusd per million tokens, interactive; blank = none"
    )
    price_cached_input_interactive = models.BigIntegerField(
        null=True, blank=True, help_text="microusd per million tokens, interactive; blank = none"
    )
    price_output_interactive = models.BigIntegerField(
        null=True, blank=True, help_text="microusd per million tokens, interactive; blank = none"
    )
    batch_media = models.JSONField(
        default=list, blank=True, help_text="Modalities the batch qualification covers; [] = text."
    )
    created_at = models.DateTimeField(default=clock.now, editable=False)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def interactive_prices(self) -> tuple[int, int, int] | None:
        """(input, cached_input, output) for interactive requests; None: not offered there."""
        found = (
            self.price_input_interactive,
            self.price_cached_input_interactive,
            self.price_output_interactive,
        )
        return None if None in found else found  # type: ignore[return-value]


class Deployment(models.Model):
    """A private deployment: only its organization can target it."""

    id = models.CharField(primary_key=True, max_length=40, default=_deployment_id, editable=False)
    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="deployments")
    name = models.CharField(max_length=200, unique=True)
    revision = models.ForeignKey(ModelRevision, on_delete=models.PROTECT, related_name="+")
    gpu_second_price = models.BigIntegerField(help_text="microusd per GPU-second")
    enabled = models.BooleanField(
        default=True,
        help_text="Off: no new batches or interactive requests (`manage.py model disable`); "
        "accepted batches keep running.",
    )
    created_at = models.DateTimeField(default=clock.now, editable=False)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.org.name})"
