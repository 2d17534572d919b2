"""`GET /v1/models` and `GET /v1/models/{id}`, as OpenAI answers them, so an
OpenAI SDK's `models.list()` and `models.retrieve()` work against the gateway.
The list holds the gateway's model (`model_name`); its aliases are accepted in
requests but not listed."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from services.gateway.errors import GatewayError
from services.gateway.state import GatewayDep

router = APIRouter()


def _model(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "streamlab"}


@router.get("/v1/models")
async def list_models(gateway: GatewayDep) -> dict[str, Any]:
    return {"object": "list", "data": [_model(gateway.settings.model_name)]}


@router.get("/v1/models/{model_id:path}")
async def retrieve_model(model_id: str, gateway: GatewayDep) -> dict[str, Any]:
    if model_id not in gateway.models:
        raise GatewayError(404, "model_not_found", f"the model {model_id[:80]!r} does not exist",
                           param="model")
    return _model(model_id)
