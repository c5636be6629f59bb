"""Reports on a quantized model: accuracy against FP32 per layer and at the output (compare.py),
and the accuracy-budgeted fallback that keeps the most sensitive layers in FP32 (fallback.py)."""
from .compare import CompareResult, LayerReport, OutputReport, compare
from .fallback import BudgetWarning, FallbackReport, quantize_within_budget

__all__ = ["compare", "CompareResult", "LayerReport", "OutputReport", "quantize_within_budget", "FallbackReport",
           "BudgetWarning"]
