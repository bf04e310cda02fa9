package io.sluicegate.example;

import java.nio.charset.StandardCharsets;
import java.security.GeneralSecurityException;
import java.security.MessageDigest;
import java.util.Arrays;
import java.util.Base64;
import java.util.LinkedHashMap;
import java.util.Map;

import javax.crypto.Cipher;
import javax.crypto.Mac;
import javax.crypto.spec.IvParameterSpec;
import javax.crypto.spec.SecretKeySpec;

/**
 * Opens the payload of a workflow declaring encrypt_payloads: `sg1:<key id>:<Fernet token>`
 * (docs/wire-format.md, Payloads). Keys as SLUICEGATE_ENCRYPTION_KEYS gives them,
 * `id:base64key,...`; a key is 32 bytes, the first 16 sign (HMAC-SHA256), the last 16 encrypt
 * (AES-128-CBC). A payload without the marker is plain JSON and is returned as it is.
 */
public final class Sealed {
    static final byte[] MARKER = "sg1:".getBytes(StandardCharsets.US_ASCII);

    private final Map<String, byte[]> keys = new LinkedHashMap<>();

    public Sealed(String encryptionKeys) {
        if (encryptionKeys == null || encryptionKeys.isBlank()) {
            return;
        }
        for (String entry : encryptionKeys.split(",")) {
            int colon = entry.indexOf(':');
            if (colon <= 0) {
                throw new IllegalArgumentException("encryption key entry without an id: write it as id:base64key");
            }
            String encoded = entry.substring(colon + 1).trim().replace('-', '+').replace('_', '/');
            while (encoded.length() % 4 != 0) {
                encoded += "=";
            }
            byte[] key = Base64.getDecoder().decode(encoded);
            if (key.length != 32) {
                throw new IllegalArgumentException("encryption key " + entry.substring(0, colon) + " is not 32 bytes");
            }
            keys.put(entry.substring(0, colon).trim(), key);
        }
    }

    public static boolean isSealed(byte[] payload) {
        return payload.length >= MARKER.length && Arrays.equals(payload, 0, MARKER.length, MARKER, 0, MARKER.length);
    }

    public byte[] open(byte[] payload) {
        if (!isSealed(payload)) {
            return payload;
        }
        String text = new String(payload, StandardCharsets.US_ASCII);
        int colon = text.indexOf(':', MARKER.length);
        if (colon < 0) {
            throw new IllegalArgumentException("a sealed payload without a key id");
        }
        String keyId = text.substring(MARKER.length, colon);
        byte[] key = keys.get(keyId);
        if (key == null) {
            throw new IllegalArgumentException("payload sealed under key '" + keyId
                + "', which is not among the configured encryption keys " + keys.keySet());
        }
        byte[] token = Base64.getUrlDecoder().decode(text.substring(colon + 1));
        // version (1) | timestamp (8) | IV (16) | ciphertext | HMAC-SHA256 (32)
        if (token.length < 1 + 8 + 16 + 16 + 32 || token[0] != (byte) 0x80) {
            throw new IllegalArgumentException("payload sealed under key '" + keyId + "' is not a Fernet token");
        }
        try {
            Mac mac = Mac.getInstance("HmacSHA256");
            mac.init(new SecretKeySpec(key, 0, 16, "HmacSHA256"));
            mac.update(token, 0, token.length - 32);
            if (!MessageDigest.isEqual(mac.doFinal(), Arrays.copyOfRange(token, token.length - 32, token.length))) {
                throw new IllegalArgumentException("payload sealed under key '" + keyId
                    + "' does not open with that key: it was altered, or the key was replaced");
            }
            Cipher cipher = Cipher.getInstance("AES/CBC/PKCS5Padding");
            cipher.init(Cipher.DECRYPT_MODE, new SecretKeySpec(key, 16, 16, "AES"),
                new IvParameterSpec(token, 9, 16));
            return cipher.doFinal(token, 25, token.length - 25 - 32);
        } catch (GeneralSecurityException e) {
            throw new IllegalArgumentException("payload sealed under key '" + keyId + "' does not open: " + e, e);
        }
    }
}
