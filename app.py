"""Sapiens2 Space: one Gradio app for pose, body parts, normals, pointmaps, matting and features,
on photos and on short video clips.

UI assembly only: the page is generated from the task registry (``sapiens2.tasks.registry``) by
``sapiens2.ui``; requests go through ``sapiens2.serving``. Run it with

    python app.py [--host 0.0.0.0] [--port 7860] [--share] [--device cuda] [--size 0.4b]
                  [--checkpoint [pose=]/path/to/ckpt.safetensors ...]

or ``gradio app.py`` for hot reload (the module's ``demo`` is built on first use).
"""

# ZeroGPU must patch torch before anything touches CUDA, so `spaces` comes first.
import spaces  # noqa: F401, I001  (import order matters)

import argparse
import importlib.util
import logging
import os
from pathlib import Path
from typing import Any

import gradio as gr

from sapiens2 import serving, zerogpu
from sapiens2.errors import OptionError, Sapiens2Error
from sapiens2.inputs.limits import MAX_FILE_BYTES
from sapiens2.models import hub_cache
from sapiens2.models.checkpoints import CHECKPOINT_HELP, CHECKPOINTS_ENV, Checkpoints
from sapiens2.runtime import heap
from sapiens2.tasks import registry
from sapiens2.ui import arrival, browser_compare, live_tab, mcp_files
from sapiens2.ui.page_runner import Runner
from sapiens2.ui.inputs import photo_input, say_on_arrival
from sapiens2.ui.layout import MODELS, about_markdown, all_tasks_event, task_tab
from sapiens2.ui.video_tab import video_tab
from sapiens2.ui.widgets import PAGE_CSS
from sapiens2.zerogpu.entry import resident_changed
from sapiens2.zerogpu.quota import ACTIVATION_HEADROOM_BYTES, cache_budget_bytes

log = logging.getLogger("sapiens2.app")

HERE = Path(__file__).resolve().parent
ASSETS = HERE / "assets"
EXAMPLES = [str(p) for p in sorted(ASSETS.glob("*")) if p.suffix.lower() in (".jpg", ".jpeg", ".png")]
ZERO_GPU = zerogpu.zero_gpu_enabled()
MAX_FILE_SIZE = f"{MAX_FILE_BYTES // 2**20}mb"  # uploads beyond this are refused before any decoding
MAX_QUEUE = 32  # waiting requests; more get a "queue is full" error instead of hanging
DELETE_CACHE = (900, 1800)  # every 15 min, delete Gradio's copies of outputs older than 30 min
ZERO_GPU_MAX_MODELS = 32  # on ZeroGPU the byte budget decides, not a count


def build_demo(
    manager: serving.ModelManager | None = None,
    *,
    concurrency: int | None = None,
    max_queue: int = MAX_QUEUE,
    folders: serving.RequestFolders | None = None,
    operator: bool | None = None,
) -> gr.Blocks:
    """The whole app as a ``gr.Blocks`` (tests drive exactly this object and its endpoints).
    ``operator``: an error also shows the operator's details in a fold (default: everywhere but
    on a Hugging Face Space, where visitors get the plain sentence only and the log the details)."""
    if operator is None:
        operator = not os.environ.get("SPACE_ID")
    heap.configure()  # before request threads allocate: they then share one heap (sapiens2/runtime/heap.py)
    manager = manager or serving.ModelManager(checkpoints=Checkpoints.from_env(), on_change=resident_changed)
    run = Runner(manager, folders or serving.RequestFolders())
    if concurrency is None:  # ZeroGPU gives each call its own GPU; one CPU/GPU does one at a time
        concurrency = 4 if ZERO_GPU else 1
    tasks = manager.tasks()  # its checkpoints show the tasks whose weights are not on the Hub
    with gr.Blocks(
        title="Sapiens2: " + ", ".join(t.tab for t in tasks.values()), delete_cache=DELETE_CACHE
    ) as demo:
        gr.Markdown(
            "# Sapiens2: human vision in one place\n"
            "Load a photo once, then run any tab on it (or **Run all tasks**). Every result has a "
            "before/after view, downloads, and an API (see *Use via API* at the bottom)."
        )
        with gr.Row():
            with gr.Column(scale=3):
                photo = photo_input(
                    label="Photo (upload, webcam or paste)",
                    sources=["upload", "webcam", "clipboard"],
                    height=340,
                )
                say_on_arrival(photo, gr.Markdown(elem_id="photo-status"))
            with gr.Column(scale=2):
                all_button = gr.Button("Run all tasks", variant="secondary")
                all_status = gr.Textbox(label="Run all tasks: status", interactive=False, max_lines=4)
                gr.Markdown(
                    f"Photos up to {MAX_FILE_SIZE}; sides above 4096 px are downscaled for inference "
                    f"and results mapped back. {weights_note(manager)}"
                )
        with gr.Tabs():
            tabs = [task_tab(run, task, photo, EXAMPLES, operator) for task in tasks.values()]
            video_tab(run, MODELS)  # its own clip input; /video and /video_plan
            live_tab.live_tab(run)  # the webcam, streamed (a notice on ZeroGPU)
        all_tasks_event(run, tasks, tabs, photo, all_button, all_status)
        with gr.Accordion("About Sapiens2, licence and links", open=False):
            gr.Markdown(about_markdown(tasks))
    demo.queue(max_size=max_queue, default_concurrency_limit=concurrency)
    return demo


# ----------------------------------------------------------------------------- command line


def weights_note(manager: serving.ModelManager) -> str:
    """Where this server's weights come from, as the page says it: the Hub only where a shown task
    has no local checkpoint and downloads are allowed."""
    from huggingface_hub import constants

    tasks = manager.tasks().values()
    local = [t for t in tasks if registry.local_checkpoint_found(t.spec, manager.checkpoints)]
    if len(local) == len(tasks):
        return "Weights: this server's local checkpoints."
    if constants.HF_HUB_OFFLINE:
        return "Offline: weights come from local checkpoints and files already downloaded."
    if local:
        return f"Weights download from the Hub on first use ({', '.join(t.tab for t in local)}: local checkpoints)."
    return "Weights download from the Hub on first use."


def _mcp_available() -> bool:
    """MCP tools only when the extra is installed (gradio[mcp]); never an import error."""
    try:
        return (
            importlib.util.find_spec("mcp") is not None and importlib.util.find_spec("gradio.mcp") is not None
        )
    except (ImportError, ValueError):
        return False


def _dtype(name: str | None) -> Any:
    if name in (None, "auto"):
        return None
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description="Sapiens2 Space: pose, body parts, normals, 3D, matting, features."
    )
    ap.add_argument("--host", default=None, help="address to bind (default 127.0.0.1; 0.0.0.0 for a LAN)")
    ap.add_argument("--port", type=int, default=None, help="port (default 7860 or the next free one)")
    ap.add_argument("--share", action="store_true", help="also open a public gradio.live link")
    ap.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available)")
    ap.add_argument(
        "--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
        help="weights dtype (default auto: bfloat16 on a GPU, float32 on a CPU)",
    )  # fmt: skip
    ap.add_argument("--size", default=None, help="default model size for every task that offers it")
    ap.add_argument(
        "--checkpoint", action="append", default=[], metavar="[TASK=]PATH",
        help=f"{CHECKPOINT_HELP}. TASK: {', '.join(registry.declared())} (also ${CHECKPOINTS_ENV})",
    )  # fmt: skip
    ap.add_argument("--max-models", type=int, default=None, help="models kept loaded besides preloaded ones")
    ap.add_argument("--preload", action="store_true", help="load each task's default size before serving")
    ap.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile each model when it loads (local CUDA GPU only; costs start-up time)",
    )
    ap.add_argument("--concurrency", type=int, default=None, help="requests running models at once")
    ap.add_argument(
        "--runtime",
        default="torch",
        choices=["torch", "onnxruntime", "onnxruntime-int8"],
        help="torch, or each model exported to ONNX on first use and run by ONNX Runtime (docs/ONNX.md)",
    )
    return ap.parse_args(argv)


def manager_from_args(args: argparse.Namespace) -> serving.ModelManager:
    """The model cache the command line asks for (exits with a message on a bad option)."""
    try:
        checkpoints = Checkpoints.from_env() | Checkpoints.parse(args.checkpoint)
        if args.size:
            sizes = {s for t in registry.all_tasks(checkpoints).values() for s in t.spec.sizes}
            if args.size not in sizes:
                raise OptionError(
                    f"--size {args.size!r} is not a model size; choose one of: {', '.join(sorted(sizes))}."
                )
    except Sapiens2Error as err:  # a bad option, a missing or unreadable checkpoint
        raise SystemExit(f"error: {err}") from None
    manager = serving.ModelManager(
        device=args.device,
        dtype=_dtype(args.dtype),
        checkpoints=checkpoints,
        max_models=args.max_models or (ZERO_GPU_MAX_MODELS if ZERO_GPU else serving.DEFAULT_MAX_MODELS),
        size=args.size,
        compile=args.compile,
        # ZeroGPU: every worker moves all resident weights onto its slice (docs/ZEROGPU.md)
        max_bytes=cache_budget_bytes(0, ACTIVATION_HEADROOM_BYTES) if ZERO_GPU else None,
        on_change=resident_changed,  # a fresh GPU worker after every load or eviction
        runtime=args.runtime,
    )
    if ZERO_GPU or args.preload:
        # ZeroGPU packs tensors placed on "cuda" before launch and maps them into every GPU
        # worker: the default size of each task stays warm; other sizes load on demand.
        manager.preload()  # failures are logged; those tasks report the error per request
    if os.environ.get("SPACE_ID"):  # on a Space: keep the defaults + the latest other size on disk
        hub_cache.enable_pruning(keep_sizes=1)
    return manager


def app_kwargs() -> dict[str, Any]:
    """The FastAPI arguments of the served app: the middlewares (the run info's arrival stamp,
    sapiens2/ui/arrival.py; the Live tab's count of frames posted, sapiens2/ui/live_tab.py; the
    files of "Compute in my browser", sapiens2/ui/browser_compare.py) and
    the lifespan (the MCP tools' file texts, sapiens2/ui/mcp_files.py). A fresh dict each time:
    Gradio adds to it."""
    kwargs = arrival.app_kwargs()
    kwargs["middleware"].append(live_tab.middleware())
    kwargs["middleware"].append(browser_compare.middleware())  # "Compute in my browser"'s files
    kwargs["lifespan"] = mcp_files.lifespan
    return kwargs


def launch(
    demo: gr.Blocks, *, host: str | None = None, port: int | None = None, share: bool = False, **extra: Any
):
    """Start the server the way the Space does (tests call this too, with ``prevent_thread_lock``)."""
    serving.release_cpu_threads()  # start-up's torch work (model loads) ran on this thread
    return demo.launch(
        server_name=host or os.environ.get("GRADIO_SERVER_NAME"),
        server_port=port,
        share=share,
        max_file_size=MAX_FILE_SIZE,
        allowed_paths=[str(ASSETS)],
        mcp_server=_mcp_available(),
        app_kwargs=app_kwargs(),  # the middlewares and the lifespan (above)
        css=PAGE_CSS,
        **extra,
    )


def main(argv: list[str] | None = None) -> gr.Blocks:
    global demo
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per Gradio-internal request
    demo = build_demo(manager_from_args(args), concurrency=args.concurrency)
    launch(demo, host=args.host, port=args.port, share=args.share)  # returns at once in a hot reload
    return demo


def __getattr__(name: str) -> Any:
    """``app.demo`` is built on first use (``gradio app.py`` asks for it); importing the module
    for tests builds nothing."""
    if name == "demo":
        global demo
        demo = build_demo(manager_from_args(parse_args([])))
        return demo
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    main()
