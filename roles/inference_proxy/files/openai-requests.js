// The checks nginx makes before a request reaches the engine (njs, https://nginx.org/en/docs/njs/reference.html).
// The API key: nginx's map compares the SHA-256 of the presented bearer token with those of the keys, so the time a
// comparison takes (memcmp stops at the first differing byte) depends on digests, not on how much of a key was right.
// A malformed request gets a 400 in the OpenAI error shape instead of the engine's 500 (transformers serve), and no
// request may ask for more output tokens than $llmtune_max_output_tokens: the engine generates what it is asked for,
// and a client that gave up does not stop a non-streamed generation (transformers serve).

import crypto from 'crypto';

// The field each endpoint needs, and the types it accepts (OpenAI API reference).
var INPUTS = {
    '/v1/chat/completions': ['messages', 'a non-empty array of messages with a role and a string or array content'],
    '/v1/completions': ['prompt', 'a non-empty string or array'],
    '/v1/responses': ['input', 'a non-empty string or array']
};
var LENGTHS = ['max_tokens', 'max_completion_tokens', 'max_output_tokens'];
var NUMBERS = ['temperature', 'top_p', 'frequency_penalty', 'presence_penalty'];

function refuse(r, param, message) {
    r.headersOut['Content-Type'] = 'application/json';
    r.return(400, JSON.stringify({error: {message: message, type: 'invalid_request_error', param: param,
                                          code: 'invalid_request'}}) + '\n');
}

function nonEmpty(value, field) {
    if (field === 'messages') {
        return Array.isArray(value) && value.length > 0 && value.every(function (m) {
            return m !== null && typeof m === 'object' && typeof m.role === 'string' &&
                (typeof m.content === 'string' || Array.isArray(m.content) || m.content === null ||
                 m.content === undefined);
        });
    }
    return (typeof value === 'string' || Array.isArray(value)) && value.length > 0;
}

// Absent, or an integer from 1 to limit.
function withinLimit(value, limit) {
    return value === undefined || value === null || (Number.isInteger(value) && value >= 1 && value <= limit);
}

function check(r) {
    var body;
    // requestText holds the body while it fits client_body_buffer_size (set to the body limit).
    try {
        body = JSON.parse(r.requestText);
    } catch (e) {
        return refuse(r, null, 'the request body is not JSON');
    }
    if (body === null || typeof body !== 'object' || Array.isArray(body)) {
        return refuse(r, null, 'the request body must be a JSON object');
    }
    var limit = Number(r.variables.llmtune_max_output_tokens);
    // transformers serve takes a whole generation config (a JSON string) from the request, its lengths included.
    if (body.generation_config !== undefined && body.generation_config !== null) {
        var config;
        try {
            config = JSON.parse(body.generation_config);
        } catch (e) {
            config = null;
        }
        if (config === null || typeof config !== 'object' || Array.isArray(config) ||
            !withinLimit(config.max_new_tokens, limit) || !withinLimit(config.max_length, limit)) {
            return refuse(r, 'generation_config', 'generation_config must be a JSON object string whose ' +
                          'max_new_tokens and max_length are integers from 1 to ' + limit);
        }
    }
    var input = INPUTS[r.uri];
    if (!nonEmpty(body[input[0]], input[0])) {
        return refuse(r, input[0], input[0] + ' must be ' + input[1]);
    }
    for (var i = 0; i < LENGTHS.length; i++) {
        if (!withinLimit(body[LENGTHS[i]], limit)) {
            return refuse(r, LENGTHS[i], LENGTHS[i] + ' must be an integer from 1 to ' + limit);
        }
    }
    for (var j = 0; j < NUMBERS.length; j++) {
        var number = body[NUMBERS[j]];
        if (number !== undefined && number !== null && !(typeof number === 'number' && isFinite(number))) {
            return refuse(r, NUMBERS[j], NUMBERS[j] + ' must be a number');
        }
    }
    if (body.seed !== undefined && body.seed !== null && !Number.isInteger(body.seed)) {
        return refuse(r, 'seed', 'seed must be an integer');
    }
    if (body.stream !== undefined && body.stream !== null && typeof body.stream !== 'boolean') {
        return refuse(r, 'stream', 'stream must be true or false');
    }
    r.internalRedirect('@engine');
}

// js_set: the first 128 bits of the SHA-256 of the token of an "Authorization: Bearer <token>" header (RFC 6750; the
// scheme's case does not matter, RFC 9110 11.1) in lowercase hex, or '' for any other header or none. 32 characters
// fit a map's default hash bucket (64 bytes on x86-64; the whole digest would need map_hash_bucket_size, an http-wide
// directive another site may set too); forging a key still takes 2^128 guesses.
function bearerDigest(r) {
    var header = r.headersIn.Authorization;
    if (typeof header !== 'string' || header.slice(0, 7).toLowerCase() !== 'bearer ') {
        return '';
    }
    return crypto.createHash('sha256').update(header.slice(7)).digest('hex').slice(0, 32);
}

export default {check, bearerDigest};
