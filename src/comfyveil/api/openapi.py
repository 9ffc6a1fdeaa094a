"""``GET /v1/openapi.json``: an OpenAPI 3.1 document of every /v1 route, so a client can
be generated from it and the test suite checks each answer against it (schemathesis)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from comfyveil import __version__
from comfyveil.api.job_view import STATES

NULL_STR = {"type": ["string", "null"]}
NULL_INT = {"type": ["integer", "null"]}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


ERRORS = {"default": _json(_ref("Error"), "An error in OpenAI's shape, in one plain sentence.")}
BEARER = [{"key": []}]
JOB_ID = {
    "name": "job",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "format": "uuid"},
    "description": "The job's id.",
}

SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["message", "type", "param", "code"],
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "param": NULL_STR,
                    "code": NULL_STR,
                },
            }
        },
    },
    "Model": {
        "type": "object",
        "required": ["id", "object", "created", "owned_by"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "model"},
            "created": {"type": "integer"},
            "owned_by": {"type": "string"},
        },
    },
    "Output": {
        "type": "object",
        "required": ["index", "type", "content_type", "size", "url"],
        "properties": {
            "index": {"type": "integer", "minimum": 0},
            "type": {"type": "string", "description": "image or video"},
            "content_type": {"type": "string"},
            "size": {"type": "integer", "description": "bytes"},
            "url": {"type": "string", "description": "where to GET it, with the key"},
        },
    },
    "Job": {
        "type": "object",
        "required": [
            "id",
            "object",
            "command",
            "state",
            "status_text",
            "position",
            "eta_seconds",
            "progress",
            "created_at",
            "started_at",
            "finished_at",
            "seed",
            "outputs",
            "error",
        ],
        "properties": {
            "id": {"type": "string", "format": "uuid"},
            "object": {"const": "job"},
            "command": {"type": "string"},
            "state": {"enum": list(STATES)},
            "status_text": {
                "type": "string",
                "description": "the state in a word, in the account's language",
            },
            "position": {**NULL_INT, "description": "jobs ahead in the queue (queued only)"},
            "eta_seconds": {"type": ["number", "null"]},
            "progress": {
                "type": "object",
                "required": ["step", "steps", "percent"],
                "properties": {
                    "step": NULL_INT,
                    "steps": NULL_INT,
                    "percent": {"type": ["number", "null"]},
                },
            },
            "created_at": {"type": "string", "format": "date-time"},
            "started_at": {"type": ["string", "null"], "format": "date-time"},
            "finished_at": {"type": ["string", "null"], "format": "date-time"},
            "seed": NULL_INT,
            "outputs": {"type": "array", "items": _ref("Output")},
            "error": {
                "type": ["object", "null"],
                "required": ["message"],
                "properties": {"message": {"type": "string"}},
            },
        },
    },
    "JobList": {
        "type": "object",
        "required": ["object", "data", "has_more", "next_cursor"],
        "properties": {
            "object": {"const": "list"},
            "data": {"type": "array", "items": _ref("Job")},
            "has_more": {"type": "boolean"},
            "next_cursor": NULL_STR,
        },
    },
    "NewJob": {
        "type": "object",
        "required": ["command"],
        "properties": {
            "command": {"type": "string", "description": "a command of GET /v1/models"},
            "prompt": {"type": "string"},
            "options": {
                "type": "object",
                "description": 'the command\'s options by name, e.g. {"steps": 4, "ar": "16:9"}',
                "additionalProperties": {"type": ["string", "number", "boolean"]},
            },
            "images": {
                "type": "array",
                "maxItems": 4,
                "items": {"type": "string", "description": "data:image/png;base64,..."},
            },
        },
    },
    "Images": {
        "type": "object",
        "required": ["created", "data"],
        "properties": {
            "created": {"type": "integer"},
            "data": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"b64_json": {"type": "string"}, "url": {"type": "string"}},
                },
            },
        },
    },
}

_FILE = {"description": "The file.", "content": {"*/*": {"schema": {}}}}
_IMAGE_REQUEST = {
    "type": "object",
    "required": ["model", "prompt"],
    "properties": {
        "model": {"type": "string"},
        "prompt": {"type": "string"},
        "n": {"type": "integer", "minimum": 1, "maximum": 10},
        "size": {"type": "string"},
        "response_format": {"enum": ["b64_json", "url"]},
    },
}

PATHS: dict[str, Any] = {
    "/models": {
        "get": {
            "summary": "The commands this key may run.",
            "security": BEARER,
            "responses": {
                "200": _json(
                    {
                        "type": "object",
                        "required": ["object", "data"],
                        "properties": {
                            "object": {"const": "list"},
                            "data": {"type": "array", "items": _ref("Model")},
                        },
                    },
                    "The models.",
                ),
                **ERRORS,
            },
        }
    },
    "/models/{model}": {
        "get": {
            "summary": "One command.",
            "security": BEARER,
            "parameters": [
                {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}
            ],
            "responses": {"200": _json(_ref("Model"), "The model."), **ERRORS},
        }
    },
    "/images/generations": {
        "post": {
            "summary": "OpenAI's image generation; answers when the images are made.",
            "security": BEARER,
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _IMAGE_REQUEST}},
            },
            "responses": {"200": _json(_ref("Images"), "The images."), **ERRORS},
        }
    },
    "/images/edits": {
        "post": {
            "summary": "OpenAI's image edit; answers when the images are made.",
            "security": BEARER,
            "requestBody": {
                "required": True,
                "content": {
                    "multipart/form-data": {
                        "schema": {
                            **_IMAGE_REQUEST,
                            "properties": {
                                **_IMAGE_REQUEST["properties"],
                                "image": {
                                    "type": "string",
                                    "contentMediaType": "application/octet-stream",
                                },
                            },
                        }
                    }
                },
            },
            "responses": {"200": _json(_ref("Images"), "The images."), **ERRORS},
        }
    },
    "/files/{job}/{index}": {
        "get": {
            "summary": "A result through a signed link (response_format=url); no key.",
            "parameters": [
                JOB_ID,
                {"name": "index", "in": "path", "required": True, "schema": {"type": "integer"}},
                {"name": "expires", "in": "query", "required": True, "schema": {"type": "string"}},
                {"name": "sig", "in": "query", "required": True, "schema": {"type": "string"}},
            ],
            "responses": {"200": _FILE, **ERRORS},
        }
    },
    "/jobs": {
        "post": {
            "summary": "Queue a job of any command; answers 202 at once.",
            "security": BEARER,
            "parameters": [
                {
                    "name": "Idempotency-Key",
                    "in": "header",
                    "required": False,
                    "schema": {"type": "string", "pattern": "^[A-Za-z0-9_.:-]{1,100}$"},
                    "description": "a retry with the same key returns the same job",
                }
            ],
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": _ref("NewJob")},
                    "multipart/form-data": {
                        "schema": {
                            "type": "object",
                            "required": ["command"],
                            "properties": {
                                "command": {"type": "string"},
                                "prompt": {"type": "string"},
                                "options": {"type": "string", "description": "a JSON object"},
                                "images": {
                                    "type": "array",
                                    "items": {
                                        "type": "string",
                                        "contentMediaType": "application/octet-stream",
                                    },
                                },
                            },
                        }
                    },
                },
            },
            "responses": {"202": _json(_ref("Job"), "The job, queued."), **ERRORS},
        },
        "get": {
            "summary": "The account's jobs, newest first.",
            "security": BEARER,
            "parameters": [
                {
                    "name": "limit",
                    "in": "query",
                    "required": False,
                    "schema": {"type": "integer", "minimum": 1, "maximum": 100, "default": 20},
                },
                {
                    "name": "after",
                    "in": "query",
                    "required": False,
                    "schema": {"type": "string"},
                    "description": "next_cursor of a page",
                },
            ],
            "responses": {"200": _json(_ref("JobList"), "A page of jobs."), **ERRORS},
        },
    },
    "/jobs/{job}": {
        "get": {
            "summary": "One job.",
            "security": BEARER,
            "parameters": [JOB_ID],
            "responses": {"200": _json(_ref("Job"), "The job."), **ERRORS},
        },
        "delete": {
            "summary": "Cancel a waiting or running job; forget a finished one.",
            "security": BEARER,
            "parameters": [JOB_ID],
            "responses": {
                "200": _json(
                    {
                        "oneOf": [
                            _ref("Job"),
                            {
                                "type": "object",
                                "required": ["id", "object", "deleted"],
                                "properties": {
                                    "id": {"type": "string"},
                                    "object": {"const": "job.deleted"},
                                    "deleted": {"const": True},
                                },
                            },
                        ]
                    },
                    "The job as cancelled (a running one ends shortly), or its deletion.",
                ),
                **ERRORS,
            },
        },
    },
    "/jobs/{job}/events": {
        "get": {
            "summary": "Server-Sent Events of the job's changes, ending with its final state.",
            "security": BEARER,
            "parameters": [
                JOB_ID,
                {
                    "name": "Last-Event-ID",
                    "in": "header",
                    "required": False,
                    "schema": {"type": "string"},
                },
            ],
            "responses": {
                "200": {
                    "description": "state and job events",
                    "content": {"text/event-stream": {"schema": {"type": "string"}}},
                },
                **ERRORS,
            },
        }
    },
    "/jobs/{job}/outputs/{index}": {
        "get": {
            "summary": "One output of a finished job, as a download.",
            "security": BEARER,
            "parameters": [
                JOB_ID,
                {
                    "name": "index",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "integer", "minimum": 0},
                },
            ],
            "responses": {"200": _FILE, **ERRORS},
        }
    },
    "/openapi.json": {
        "get": {
            "summary": "This document.",
            "responses": {"200": _json({"type": "object"}, "The OpenAPI document.")},
        }
    },
}


def build() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "comfyveil API",
            "version": __version__,
            "description": "OpenAI's images API and a native jobs API over the operator's "
            "ComfyUI workflows; a key is made on the web front end's settings page.",
        },
        "servers": [{"url": "/v1"}],
        "paths": PATHS,
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {"key": {"type": "http", "scheme": "bearer"}},
        },
    }


async def document(_request: web.Request) -> web.Response:
    return web.json_response(build())
