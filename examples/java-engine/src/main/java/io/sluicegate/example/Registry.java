package io.sluicegate.example;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.util.Base64;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.avro.Schema;

/**
 * A Confluent-compatible schema registry, for the `00` + schema id framing a deployment with
 * SLUICEGATE_SCHEMA_REGISTRY_URL uses (docs/wire-format.md): the writer schema of an id is
 * fetched once; a record type's id is found by registering its schema under its full name
 * (RecordNameStrategy), which answers the existing id when the registry has it already.
 */
final class Registry {
    private static final ObjectMapper JSON = new ObjectMapper();
    private static final String CONTENT_TYPE = "application/vnd.schemaregistry.v1+json";

    private final String url;
    private final String authorization;
    private final HttpClient http = HttpClient.newHttpClient();
    private final Map<Integer, Schema> writers = new ConcurrentHashMap<>();
    private final Map<String, Integer> ids = new ConcurrentHashMap<>();

    private Registry(String url, String userInfo) {
        this.url = url.replaceAll("/+$", "");
        this.authorization = userInfo == null || userInfo.isBlank() ? null
            : "Basic " + Base64.getEncoder().encodeToString(userInfo.getBytes(StandardCharsets.UTF_8));
    }

    /** The registry the environment names, or null for a deployment without one. */
    static Registry fromEnvironment() {
        String url = System.getenv("SLUICEGATE_SCHEMA_REGISTRY_URL");
        if (url == null || url.isBlank()) {
            return null;
        }
        return new Registry(url, System.getenv("SLUICEGATE_SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO"));
    }

    Schema writerSchema(int id) {
        return writers.computeIfAbsent(id, key -> new Schema.Parser().parse(
            call(HttpRequest.newBuilder(URI.create(url + "/schemas/ids/" + key)).GET()).get("schema").asText()));
    }

    int idOf(Schema schema) {
        return ids.computeIfAbsent(schema.getFullName(), subject -> {
            String body = JSON.createObjectNode().put("schema", schema.toString()).toString();
            return call(HttpRequest.newBuilder(URI.create(url + "/subjects/" + subject + "/versions"))
                .header("Content-Type", CONTENT_TYPE)
                .POST(HttpRequest.BodyPublishers.ofString(body))).get("id").asInt();
        });
    }

    private JsonNode call(HttpRequest.Builder request) {
        request.header("Accept", CONTENT_TYPE);
        if (authorization != null) {
            request.header("Authorization", authorization);
        }
        try {
            HttpResponse<String> response = http.send(request.build(), HttpResponse.BodyHandlers.ofString());
            if (response.statusCode() / 100 != 2) {
                throw new IllegalStateException("schema registry " + response.request().uri() + " answered "
                    + response.statusCode() + ": " + response.body());
            }
            return JSON.readTree(response.body());
        } catch (IOException e) {
            throw new UncheckedIOException("schema registry " + url + " unreachable", e);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IllegalStateException("interrupted while asking the schema registry", e);
        }
    }
}
