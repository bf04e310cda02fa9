package io.sluicegate.example;

import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.net.URISyntaxException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.jar.JarFile;
import java.util.stream.Stream;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.avro.Schema;

/**
 * sluicegate's Avro schemas, parsed from the .avsc files the build packs into the jar
 * (copied from sluicegate/schemas/avro/, one file per named type, named by full name).
 * A record's schema refers to the enums and Slot by name; one parser takes the files in an
 * order where every name is defined before it is used.
 */
public final class Schemas {
    static final String FOLDER = "sluicegate-avro/";
    public static final String NAMESPACE = "io.sluicegate.";
    private static final ObjectMapper JSON = new ObjectMapper();

    private final Map<String, Schema> byName;

    private Schemas(Map<String, Schema> byName) {
        this.byName = byName;
    }

    public Schema get(String fullName) {
        Schema schema = byName.get(fullName);
        if (schema == null) {
            throw new IllegalArgumentException("no schema " + fullName + " in " + FOLDER);
        }
        return schema;
    }

    public Schema named(String simpleName) {
        return get(NAMESPACE + simpleName);
    }

    public static Schemas load() {
        Map<String, String> texts = new TreeMap<>();
        for (String file : listFolder()) {
            try (InputStream in = Schemas.class.getClassLoader().getResourceAsStream(FOLDER + file)) {
                if (in == null) {
                    throw new IllegalStateException("cannot read " + FOLDER + file);
                }
                texts.put(file, new String(in.readAllBytes(), StandardCharsets.UTF_8));
            } catch (IOException e) {
                throw new UncheckedIOException(e);
            }
        }
        return parse(texts);
    }

    /** Parses every text with one parser, each after the named types it refers to. */
    static Schemas parse(Map<String, String> texts) {
        Map<String, String> byFullName = new TreeMap<>();
        for (String file : texts.keySet()) {
            byFullName.put(file.substring(0, file.length() - ".avsc".length()), file);
        }
        Schema.Parser parser = new Schema.Parser();
        Map<String, Schema> byName = new TreeMap<>();
        for (String fullName : byFullName.keySet()) {
            define(fullName, byFullName, texts, parser, byName, new ArrayList<>());
        }
        if (byName.isEmpty()) {
            throw new IllegalStateException("no .avsc files in " + FOLDER);
        }
        return new Schemas(byName);
    }

    private static void define(String fullName, Map<String, String> files, Map<String, String> texts,
                               Schema.Parser parser, Map<String, Schema> done, List<String> path) {
        if (done.containsKey(fullName)) {
            return;
        }
        if (path.contains(fullName)) {
            throw new IllegalStateException("schemas refer to each other in a cycle: " + path);
        }
        path.add(fullName);
        String text = texts.get(files.get(fullName));
        try {
            List<String> uses = new ArrayList<>();
            references(JSON.readTree(text), files.keySet(), uses);
            for (String used : uses) {
                if (!used.equals(fullName)) {
                    define(used, files, texts, parser, done, path);
                }
            }
        } catch (IOException e) {
            throw new UncheckedIOException(files.get(fullName) + " is not JSON", e);
        }
        Schema schema = parser.parse(text);
        if (!schema.getFullName().equals(fullName)) {
            throw new IllegalStateException(files.get(fullName) + " defines " + schema.getFullName());
        }
        done.put(fullName, schema);
        path.remove(fullName);
    }

    /** Every string in the schema's JSON that names one of the other files' types. */
    private static void references(JsonNode node, Set<String> names, List<String> out) {
        if (node.isTextual() && names.contains(node.asText())) {
            out.add(node.asText());
        }
        node.forEach(child -> references(child, names, out));
    }

    /** The .avsc file names in the packed folder, from the jar or from a classes directory. */
    private static List<String> listFolder() {
        try {
            Path where = Path.of(Schemas.class.getProtectionDomain().getCodeSource().getLocation().toURI());
            List<String> names = new ArrayList<>();
            if (Files.isDirectory(where)) {
                try (Stream<Path> files = Files.list(where.resolve(FOLDER))) {
                    files.map(p -> p.getFileName().toString()).filter(n -> n.endsWith(".avsc")).forEach(names::add);
                }
            } else {
                try (JarFile jar = new JarFile(where.toFile())) {
                    jar.stream().map(e -> e.getName())
                        .filter(n -> n.startsWith(FOLDER) && n.endsWith(".avsc") && n.indexOf('/', FOLDER.length()) < 0)
                        .forEach(n -> names.add(n.substring(FOLDER.length())));
                }
            }
            return names;
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        } catch (URISyntaxException e) {
            throw new IllegalStateException(e);
        }
    }
}
