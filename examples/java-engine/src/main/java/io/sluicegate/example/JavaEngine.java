package io.sluicegate.example;

import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Duration;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericRecord;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.consumer.AcknowledgeType;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.consumer.RangeAssignor;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.errors.WakeupException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * A workflow engine for sluicegate in Java, following docs/wire-format.md ("Being an engine").
 *
 * Every workflow it runs does the same thing: it waits `holdMs` milliseconds (a payload
 * field, default 100), then completes, or fails with the payload's `fail` text if it has one.
 * A cancel command stops a run and reports it cancelled; a redrive runs a failed run again.
 *
 * With --share-group it takes admitted starts in the share group G (Kafka 4.2 or later),
 * any number of instances from the same partitions, and reads the commands in a consumer
 * group of its own, G.commands.<instance>: every instance sees every command and acts on the
 * runs it holds.
 *
 * Usage: java -jar sluicegate-java-engine.jar [run] [--group G] [--heartbeat-ms N]
 *            [--share-group [--instance NAME]]
 *        java -jar sluicegate-java-engine.jar check-golden docs/wire-format/golden.json
 * Settings: SLUICEGATE_BOOTSTRAP (127.0.0.1:9092), SLUICEGATE_NAMESPACE (sg.),
 * SLUICEGATE_ENCRYPTION_KEYS (to open sealed payloads), SLUICEGATE_SCHEMA_REGISTRY_URL and
 * SLUICEGATE_SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO (a deployment with a schema registry).
 */
public final class JavaEngine {
    private static final ObjectMapper JSON = new ObjectMapper();
    // How many execution ids the engine remembers, to drop a start delivered twice.
    private static final int REMEMBERED = 100_000;

    private final Schemas schemas = Schemas.load();
    private final Frames frames = new Frames(Registry.fromEnvironment());
    private final Sealed sealed = new Sealed(System.getenv("SLUICEGATE_ENCRYPTION_KEYS"));
    private final Schema admittedSchema = schemas.named("AdmittedStart");
    private final Schema commandSchema = schemas.named("EngineCommand");
    private final Schema eventSchema = schemas.named("RunEvent");
    private final Schema eventKind = schemas.named("RunEventKind");

    private final String admittedTopic;
    private final String commandsTopic;
    private final String eventsTopic;
    /** The admitted starts and the commands; with a share group, the commands only. */
    private final KafkaConsumer<String, byte[]> consumer;
    /** The admitted starts, with a share group; null otherwise. */
    private final KafkaShareConsumer<String, byte[]> shareConsumer;
    private final KafkaProducer<String, byte[]> producer;
    private final long heartbeatMs;
    private final ScheduledExecutorService clock = Executors.newSingleThreadScheduledExecutor();

    // The poll loop's thread handles every record; the clock's thread ends runs and sends
    // heartbeats. `seen` and `cancelledEarly` belong to the poll loop alone.

    /** Runs in progress, by execution id; whoever removes a run reports its end. */
    private final Map<String, Run> running = new ConcurrentHashMap<>();
    /** Execution ids begun here, oldest first (a bounded set): a start read twice is dropped. */
    private final Set<String> seen = java.util.Collections.newSetFromMap(new LinkedHashMap<>() {
        @Override
        protected boolean removeEldestEntry(Map.Entry<String, Boolean> eldest) {
            return size() > REMEMBERED;
        }
    });
    /** Cancels read before their run's admitted start: the start is answered cancelled. */
    private final Map<String, String> cancelledEarly = new LinkedHashMap<>() {
        @Override
        protected boolean removeEldestEntry(Map.Entry<String, String> eldest) {
            return size() > REMEMBERED;
        }
    };
    /** Runs that failed here, by execution id: a redrive runs them again. */
    private final Map<String, String> failedRuns = new ConcurrentHashMap<>();
    private final AtomicReference<Exception> sendError = new AtomicReference<>();
    private volatile boolean stopping;

    private static final class Run {
        final String executionId;
        final String workflow;
        final String runId = "java-" + UUID.randomUUID();
        volatile ScheduledFuture<?> end;

        Run(String executionId, String workflow) {
            this.executionId = executionId;
            this.workflow = workflow;
        }
    }

    /** What a share group of engines needs beside Kafka's defaults (docs/wire-format.md). */
    static final Map<String, String> SHARE_GROUP_CONFIG = Map.of(
        "share.auto.offset.reset", "earliest",
        "share.isolation.level", "read_committed");

    JavaEngine(String bootstrap, String namespace, String group, long heartbeatMs, String instance) {
        this.admittedTopic = namespace + "admitted";
        this.commandsTopic = namespace + "commands";
        this.eventsTopic = namespace + "run-events";
        this.heartbeatMs = heartbeatMs;
        Properties consumerConfig = new Properties();
        consumerConfig.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        if (instance == null) {
            consumerConfig.put(ConsumerConfig.GROUP_ID_CONFIG, group);
            this.shareConsumer = null;
        } else {
            consumerConfig.put(ConsumerConfig.GROUP_ID_CONFIG, group + ".commands." + instance);
            configureShareGroup(bootstrap, group);
            Properties shareConfig = new Properties();
            shareConfig.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
            shareConfig.put(ConsumerConfig.GROUP_ID_CONFIG, group);
            // Each start is accepted once its run is reported started, not when polled.
            shareConfig.put("share.acknowledgement.mode", "explicit");
            this.shareConsumer = new KafkaShareConsumer<>(shareConfig, new StringDeserializer(), new ByteArrayDeserializer());
        }
        // Range: the same partition numbers of sg.admitted and sg.commands, so a run's
        // commands come to the instance that has its start.
        consumerConfig.put(ConsumerConfig.PARTITION_ASSIGNMENT_STRATEGY_CONFIG, RangeAssignor.class.getName());
        consumerConfig.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        consumerConfig.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        consumerConfig.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        consumerConfig.put(ConsumerConfig.FETCH_MAX_WAIT_MS_CONFIG, "50");
        this.consumer = new KafkaConsumer<>(consumerConfig, new StringDeserializer(), new ByteArrayDeserializer());
        Properties producerConfig = new Properties();
        producerConfig.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        producerConfig.put(ProducerConfig.ACKS_CONFIG, "all");
        producerConfig.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        producerConfig.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        // The default partitioner hashes a keyed record with murmur2: where sluicegate expects it.
        this.producer = new KafkaProducer<>(producerConfig, new StringSerializer(), new ByteArraySerializer());
    }

    private static void configureShareGroup(String bootstrap, String group) {
        Properties adminConfig = new Properties();
        adminConfig.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        List<AlterConfigOp> ops = SHARE_GROUP_CONFIG.entrySet().stream()
            .map(e -> new AlterConfigOp(new ConfigEntry(e.getKey(), e.getValue()), AlterConfigOp.OpType.SET))
            .toList();
        try (Admin admin = Admin.create(adminConfig)) {
            admin.incrementalAlterConfigs(Map.of(new ConfigResource(ConfigResource.Type.GROUP, group), ops))
                .all().get(30, TimeUnit.SECONDS);
        } catch (Exception e) {
            throw new IllegalStateException("cannot configure share group " + group + " " + SHARE_GROUP_CONFIG
                + " (the broker needs share groups: Kafka 4.2 or later, share.version 1 or more): " + e, e);
        }
    }

    void run() {
        if (shareConsumer == null) {
            consumer.subscribe(List.of(admittedTopic, commandsTopic));
        } else {
            shareConsumer.subscribe(List.of(admittedTopic));
            consumer.subscribe(List.of(commandsTopic));
        }
        clock.scheduleAtFixedRate(this::heartbeats, heartbeatMs, heartbeatMs, TimeUnit.MILLISECONDS);
        log("engine up: reading " + admittedTopic + (shareConsumer == null ? "" : " (share group)")
            + " and " + commandsTopic + ", heartbeat every " + heartbeatMs + " ms");
        try {
            while (!stopping) {
                if (shareConsumer != null) {
                    takeShared();
                }
                ConsumerRecords<String, byte[]> records =
                    consumer.poll(Duration.ofMillis(shareConsumer == null ? 200 : 20));
                Map<TopicPartition, OffsetAndMetadata> done = new HashMap<>();
                for (ConsumerRecord<String, byte[]> record : records) {
                    handle(record);
                    done.put(new TopicPartition(record.topic(), record.partition()),
                        new OffsetAndMetadata(record.offset() + 1));
                }
                if (!done.isEmpty()) {
                    // At-least-once: the reports (started, cancelled) are on the broker before
                    // the offsets that would skip their records are committed.
                    producer.flush();
                    failOnSendError();
                    consumer.commitSync(done);
                }
                failOnSendError();
            }
        } catch (WakeupException e) {
            if (!stopping) {
                throw e;
            }
        } finally {
            clock.shutdownNow();
            if (shareConsumer != null) {
                shareConsumer.close();
            }
            consumer.close();
            producer.close();
        }
    }

    /**
     * The admitted starts of one share-group poll: each handled (begun, dropped as begun
     * before, or answered), the reports flushed to the broker, and only then each record
     * accepted, so a start whose instance dies first goes to another instance.
     */
    private void takeShared() {
        ConsumerRecords<String, byte[]> records = shareConsumer.poll(Duration.ofMillis(200));
        for (ConsumerRecord<String, byte[]> record : records) {
            short deliveries = record.deliveryCount().orElse((short) 1);
            if (deliveries > 1) {
                log("delivery " + deliveries + " of " + record.key());
            }
            admitted(frames.decode(admittedSchema, record.value()));
        }
        if (!records.isEmpty()) {
            producer.flush();
            failOnSendError();
            for (ConsumerRecord<String, byte[]> record : records) {
                shareConsumer.acknowledge(record, AcknowledgeType.ACCEPT);
            }
            shareConsumer.commitSync();
        }
    }

    void stop() {
        stopping = true;
        consumer.wakeup();
        if (shareConsumer != null) {
            shareConsumer.wakeup();
        }
    }

    private void handle(ConsumerRecord<String, byte[]> record) {
        // A record this engine cannot read stops it, its offset not committed: skipping an
        // admitted start would lose a run (and hold its slots until the lease runs out).
        if (record.topic().equals(admittedTopic)) {
            admitted(frames.decode(admittedSchema, record.value()));
        } else {
            command(frames.decode(commandSchema, record.value()));
        }
    }

    private void admitted(GenericRecord start) {
        String executionId = start.get("execution_id").toString();
        String workflow = start.get("workflow").toString();
        if (!start.get("kind").toString().equals("start")) {
            // This engine never suspends a run, so it is never asked to resume one.
            log("ignored " + start.get("kind") + " of " + executionId);
            return;
        }
        if (!seen.add(executionId)) {
            log("duplicate start of " + executionId + " dropped");
            return;
        }
        String reason = cancelledEarly.remove(executionId);
        if (reason != null) {
            report(executionId, workflow, "cancelled", null, r -> r.put("reason", reason));
            log("cancelled " + executionId + " before it started: " + reason);
            return;
        }
        JsonNode payload;
        try {
            payload = payload(start);
        } catch (IllegalArgumentException e) {
            // The run exists but cannot run: it fails, which frees what it holds.
            report(executionId, workflow, "failed", null, r -> {
                r.put("retries_spent", 0L);
                r.put("error_tag", "PayloadError");
                r.put("error_message", e.getMessage());
            });
            log("failed " + executionId + ": " + e.getMessage());
            return;
        }
        begin(executionId, workflow, payload);
    }

    private void begin(String executionId, String workflow, JsonNode payload) {
        long holdMs = payload.path("holdMs").asLong(100);
        String failure = payload.hasNonNull("fail") ? payload.get("fail").asText() : null;
        Run run = new Run(executionId, workflow);
        report(executionId, workflow, "started", run.runId, r -> { });
        running.put(executionId, run);
        run.end = clock.schedule(() -> finish(run, failure), holdMs, TimeUnit.MILLISECONDS);
        log("started " + executionId + " " + workflow + " for " + holdMs + " ms");
    }

    private JsonNode payload(GenericRecord start) {
        java.nio.ByteBuffer buffer = ((java.nio.ByteBuffer) start.get("payload")).duplicate();
        byte[] raw = new byte[buffer.remaining()];
        buffer.get(raw);
        try {
            return JSON.readTree(sealed.open(raw));
        } catch (java.io.IOException e) {
            throw new IllegalArgumentException("the payload is not JSON: " + e.getMessage(), e);
        }
    }

    private void finish(Run run, String failure) {
        if (!running.remove(run.executionId, run)) {
            return; // cancelled meanwhile: the cancel reported it
        }
        if (failure == null) {
            report(run.executionId, run.workflow, "completed", run.runId, r -> { });
            log("completed " + run.executionId);
        } else {
            failedRuns.put(run.executionId, run.workflow);
            report(run.executionId, run.workflow, "failed", run.runId, r -> {
                r.put("retries_spent", 0L);
                r.put("error_tag", "Failed");
                r.put("error_message", failure);
            });
            log("failed " + run.executionId + ": " + failure);
        }
    }

    private void command(GenericRecord command) {
        String executionId = command.get("execution_id").toString();
        String workflow = command.get("workflow").toString();
        String kind = command.get("kind").toString();
        Object why = command.get("reason");
        String reason = why == null ? "cancelled by command " + command.get("command_id") : why.toString();
        if (kind.equals("cancel")) {
            Run run = running.remove(executionId);
            if (run != null) {
                run.end.cancel(false);
                report(executionId, workflow, "cancelled", run.runId, r -> r.put("reason", reason));
                log("cancelled " + executionId + ": " + reason);
            } else if (!seen.contains(executionId)) {
                cancelledEarly.put(executionId, reason);
                log("cancel for " + executionId + " kept until its start arrives");
            }
            return;
        }
        if (kind.equals("redrive")) {
            String failedWorkflow = failedRuns.remove(executionId);
            if (failedWorkflow != null) {
                // This engine's runs have one step: redriving one runs it again.
                begin(executionId, failedWorkflow, JSON.createObjectNode());
            } else {
                log("redrive of " + executionId + " ignored: no failed run of that id here");
            }
        }
    }

    private void heartbeats() {
        for (Run run : running.values()) {
            report(run.executionId, run.workflow, "heartbeat", run.runId, r -> { });
        }
    }

    private void report(String executionId, String workflow, String kind, String runId,
                        java.util.function.Consumer<GenericRecord> fill) {
        GenericRecord event = new GenericData.Record(eventSchema);
        event.put("execution_id", executionId);
        event.put("workflow", workflow);
        event.put("kind", new GenericData.EnumSymbol(eventKind, kind));
        event.put("at_ms", System.currentTimeMillis());
        event.put("run_id", runId);
        fill.accept(event);
        producer.send(new ProducerRecord<>(eventsTopic, executionId, frames.encode(event)), (meta, error) -> {
            if (error != null) {
                sendError.compareAndSet(null, error);
            }
        });
    }

    private void failOnSendError() {
        Exception error = sendError.get();
        if (error != null) {
            throw new IllegalStateException("a run event was not delivered: " + error, error);
        }
    }

    private static void log(String line) {
        System.out.println(line);
        System.out.flush();
    }

    public static void main(String[] args) throws Exception {
        if (System.getProperty("org.slf4j.simpleLogger.defaultLogLevel") == null) {
            System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn");
        }
        if (args.length >= 2 && args[0].equals("check-golden")) {
            System.exit(GoldenCheck.run(Path.of(args[1])));
        }
        String group = "sluicegate-java-engine";
        long heartbeatMs = 60_000;
        boolean share = false;
        String instance = null;
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "run" -> { }
                case "--group" -> group = args[++i];
                case "--heartbeat-ms" -> heartbeatMs = Long.parseLong(args[++i]);
                case "--share-group" -> share = true;
                case "--instance" -> instance = args[++i];
                default -> {
                    System.err.println("unknown argument " + args[i] + "; usage: [run] [--group G]"
                        + " [--heartbeat-ms N] [--share-group [--instance NAME]] | check-golden FILE");
                    System.exit(2);
                }
            }
        }
        if (share && instance == null) {
            // A name it keeps across restarts resumes its commands where it stopped.
            instance = UUID.randomUUID().toString().substring(0, 12);
        } else if (!share && instance != null) {
            System.err.println("--instance names a share-group instance: add --share-group");
            System.exit(2);
        }
        String bootstrap = System.getenv().getOrDefault("SLUICEGATE_BOOTSTRAP", "127.0.0.1:9092");
        String namespace = System.getenv().getOrDefault("SLUICEGATE_NAMESPACE", "sg.");
        JavaEngine engine = new JavaEngine(bootstrap, namespace, group, heartbeatMs, instance);
        Thread main = Thread.currentThread();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            engine.stop();
            try {
                main.join(10_000);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }));
        engine.run();
    }
}
