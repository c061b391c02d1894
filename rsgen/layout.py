"""Where each stage reads and writes inside OUTPUT_DIR. Stages talk through these files only."""

from __future__ import annotations

from pathlib import Path


class OutputLayout:
    def __init__(self, output_dir: str | Path):
        self.root = Path(output_dir)

    @property
    def run_json(self) -> Path:
        return self.root / "run.json"

    @property
    def prepared(self) -> Path:
        """Cleaned pool: parquet shards (one row per image) + prepare_report.json."""
        return self.root / "prepared"

    @property
    def prepared_partial(self) -> Path:
        """Where prepare builds the pool before swapping it into `prepared/`."""
        return self.root / "prepared.partial"

    @property
    def prepare_report(self) -> Path:
        return self.prepared / "prepare_report.json"

    @property
    def work(self) -> Path:
        return self.root / "work"

    @property
    def generate_work(self) -> Path:
        """CheckpointStore parts of the generate stage (one record per QA id and sample)."""
        return self.work / "generate"

    @property
    def verify_work(self) -> Path:
        """CheckpointStore parts of the verify stage (one decision per generate record) and `settings.json`, the
        verifier settings they were made with."""
        return self.work / "verify"

    @property
    def verify_previous(self) -> Path:
        """The decisions of the previous verifier settings while verify decides again (to count what changed)."""
        return self.work / "verify.previous"

    @property
    def explore_work(self) -> Path:
        """CheckpointStore parts of the explore stage (one record per sampled response, key "{id}#{sample}")."""
        return self.work / "explore"

    @property
    def explore_pass_rates(self) -> Path:
        """One JSON line per explored question: samples drawn, verified correct, pass rate (written by explore)."""
        return self.work / "explore_pass_rates.jsonl"

    @property
    def blind_work(self) -> Path:
        """Blind-check records: accepted pairs asked again without their image."""
        return self.work / "blind"

    @property
    def emit_index(self) -> Path:
        """Emit's scratch index of the work (rsgen.emit.work_index): built by every emit, removed when it ends."""
        return self.work / "emit-index.sqlite"

    @property
    def judge_work(self) -> Path:
        """CheckpointStore parts of the judge stage (one record per judged QA id)."""
        return self.work / "judge"

    @property
    def dataset(self) -> Path:
        return self.root / "dataset"

    @property
    def dataset_partial(self) -> Path:
        """Where emit builds the dataset before swapping it into `dataset/`."""
        return self.root / "dataset.partial"

    @property
    def stats_json(self) -> Path:
        return self.root / "stats.json"

    # `rsgen iterate`: OUTPUT_DIR holds the pool prepared once, one pipeline output directory per round, the
    # models the rounds trained, and the final dataset built from every round (dataset/, stats.json as above).

    @property
    def iterate_json(self) -> Path:
        """The loop's state and figures: held-out slice, per round its model, accept rates, training loss."""
        return self.root / "iterate.json"

    @property
    def training_value(self) -> Path:
        """What the run's data is worth, measured by bench/bench_training_value.py (which writes it into its round 0
        run): when present, emit puts it in stats.json and the card shows it ("What the data is worth")."""
        return self.root / "training_value.json"

    @property
    def held_out_images(self) -> Path:
        """The image sha256s of the held-out slice, one a line (fixed when the loop starts)."""
        return self.root / "held_out_images.txt"

    def round_dir(self, k: int) -> Path:
        """Round k's pipeline output directory (a complete `rsgen run` output, answered by model k)."""
        return self.root / "rounds" / str(k)

    def round_training(self, k: int, kind: str = "sft") -> Path:
        """TRL's output_dir of round k's fine-tuning (its checkpoints, resumed from after a kill): training/ for
        SFT, training_dpo/ for the DPO step."""
        return self.round_dir(k) / ("training" if kind == "sft" else f"training_{kind}")

    def round_sft_model(self, k: int) -> Path:
        """Round k's SFT model when a DPO step follows it (model k+1 is the DPO result)."""
        return self.round_dir(k) / "sft_model"

    def model_dir(self, k: int) -> Path:
        """Model k (k >= 1), trained by round k - 1; model 0 is the recipe's model_name_or_path."""
        return self.root / "models" / str(k)
